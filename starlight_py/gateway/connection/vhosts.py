"""Resolves the vhost of connection.open to an existing Pulsar namespace."""

from __future__ import annotations

import logging

import trio

from starlight_py.amqp.errors import InternalError, NotAllowed
from starlight_py.amqp.method_ids import CONNECTION_OPEN
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdmin, PulsarAdminError
from starlight_py.model.namespaces import InvalidVhostName, NamespaceName, NamespaceRules

log = logging.getLogger("starlight.vhosts")


class VhostResolver:
    """Vhost -> namespace by rule, checked against Pulsar (and created there when
    `auto_create`). Namespaces seen to exist are remembered: Pulsar does not delete
    namespaces behind our back, and connection.open must stay fast."""

    def __init__(self, rules: NamespaceRules, admin: PulsarAdmin, auto_create: bool) -> None:
        self.rules = rules
        self.admin = admin
        self.auto_create = auto_create
        self._known: set[NamespaceName] = set()

    async def resolve(self, vhost: str) -> NamespaceName:
        """Raises NotAllowed (530) for a vhost that cannot be used, InternalError (541) when
        Pulsar cannot be asked."""
        try:
            namespace = self.rules.namespace_for(vhost)
        except InvalidVhostName as e:
            raise NotAllowed(f"vhost '{vhost}' not found: {e}", CONNECTION_OPEN) from e
        await self.check_namespace(vhost, namespace)
        return namespace

    async def check_namespace(self, vhost: str, namespace: NamespaceName) -> None:
        """Make sure the namespace exists in Pulsar (creating it when allowed); raises
        NotAllowed or InternalError as `resolve`."""
        if namespace in self._known:
            return
        try:
            exists = await trio.to_thread.run_sync(
                self.admin.namespace_exists, namespace.tenant, namespace.namespace
            )
            if not exists:
                if not self.auto_create:
                    raise NotAllowed(
                        f"vhost '{vhost}' not found: Pulsar namespace {namespace} does not "
                        f"exist (create the vhost: starlight-admin vhost create {vhost!r}; "
                        "or set amqpAutoCreateNamespaces=true)",
                        CONNECTION_OPEN,
                    )
                await trio.to_thread.run_sync(
                    self.admin.create_namespace, namespace.tenant, namespace.namespace
                )
                log.info("created Pulsar namespace %s for vhost %r", namespace, vhost)
        except BackendUnavailable as e:
            raise InternalError(f"cannot open vhost '{vhost}': {e}", CONNECTION_OPEN) from e
        except PulsarAdminError as e:
            raise NotAllowed(
                f"vhost '{vhost}' not usable: Pulsar refused namespace {namespace}: {e}",
                CONNECTION_OPEN,
            ) from e
        self._known.add(namespace)
