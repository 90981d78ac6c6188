"""What commands work with: the configuration and, opened on first use, a ZooKeeper session,
the Pulsar admin REST client and the TopologyService. No proxy needs to run."""

from __future__ import annotations

from functools import cached_property

from starlight_py.admin.errors import AdminError, UsageError
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdmin, PulsarAdminError
from starlight_py.backend.pulsar_client import PulsarBackend
from starlight_py.config import ConfigError, StarlightConfig
from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.records import Paths, VhostRecord
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model.namespaces import InvalidVhostName, NamespaceName, NamespaceRules
from starlight_py.topology.service import TopologyService
from starlight_py.units import SECONDS

# Owner of what the admin declares: never an exclusive queue's connection.
ADMIN_OWNER = "starlight-admin"


class AdminContext:
    def __init__(self, config: StarlightConfig) -> None:
        self.config = config
        self.paths = Paths(config.metadata_root)
        self.rules = NamespaceRules(
            config.default_tenant, config.default_namespace, config.map_short_vhost_to_tenant
        )
        self._zk: ZooKeeperClient | None = None
        self._backend: PulsarBackend | None = None
        self._owns_zk = True

    @classmethod
    def sharing(cls, config: StarlightConfig, topology: TopologyService) -> AdminContext:
        """A context on a running proxy's ZooKeeper session and topology service (the
        management API); close() leaves them open."""
        ctx = cls(config)
        ctx._zk = topology.zk
        ctx._owns_zk = False
        ctx.__dict__["topology"] = topology  # what the cached_property would hold
        ctx.__dict__["admin"] = topology.admin
        return ctx

    @property
    def zk(self) -> ZooKeeperClient:
        """The ZooKeeper session, started on first use; raises MetadataUnavailable."""
        if self._zk is None:
            zk = ZooKeeperClient(
                self.config.zookeeper_servers, self.config.zookeeper_session_timeout
            )
            zk.start(timeout=10 * SECONDS)
            self._zk = zk
        return self._zk

    @cached_property
    def admin(self) -> PulsarAdmin:
        try:
            admin = PulsarAdmin.from_config(self.config)
        except ConfigError as e:
            raise UsageError(f"configuration error: {e}") from e
        # Whether the proxies batch or not, counts in messages are right: use the brokers'
        # backlog plugin when they have it (asked at the first count).
        admin.message_backlogs = None
        return admin

    @cached_property
    def topology(self) -> TopologyService:
        return TopologyService(
            self.zk, self.paths, self.admin, None, EphemeralNodes(self.zk, ADMIN_OWNER)
        )

    @property
    def backend(self) -> PulsarBackend:
        """A Pulsar client, for the few commands that read subscriptions (queue purge)."""
        if self._backend is None:
            try:
                self._backend = PulsarBackend.from_config(self.config)
            except ConfigError as e:
                raise UsageError(f"configuration error: {e}") from e
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        if self._zk is not None and self._owns_zk:
            self._zk.stop()
            self._zk = None

    # ---- vhosts ---------------------------------------------------------------------------

    def vhost(self, name: str) -> VhostRecord:
        """The vhost's record; raises AdminError when there is none."""
        record = self.topology.get_vhost(name)
        if record is None:
            raise AdminError(
                f"no vhost '{name}' (create it with: starlight-admin vhost create {name})"
            )
        return record

    def namespace_by_rule(self, name: str) -> NamespaceName:
        """Raises UsageError when the rules cannot map the name."""
        try:
            return self.rules.namespace_for(name)
        except InvalidVhostName as e:
            raise UsageError(str(e)) from e

    def ensure_namespace(self, namespace: NamespaceName) -> bool:
        """Create the Pulsar tenant/namespace when missing; True when it was created.
        Raises AdminError when Pulsar refuses or cannot be reached."""
        try:
            if self.admin.namespace_exists(namespace.tenant, namespace.namespace):
                return False
            self.admin.create_namespace(namespace.tenant, namespace.namespace)
        except PulsarAdminError as e:
            raise AdminError(f"Pulsar refused to create namespace {namespace}: {e}") from e
        except BackendUnavailable as e:
            raise AdminError(str(e)) from e
        return True

    def usable_vhost(self, name: str) -> tuple[VhostRecord, bool]:
        """The vhost's record, created as a first connection would (namespace by rule, made
        in Pulsar when missing) when there is none yet; True when created."""
        record = self.topology.get_vhost(name)
        if record is not None:
            return record, False
        namespace = self.namespace_by_rule(name)
        self.ensure_namespace(namespace)
        return self.topology.ensure_vhost(name, namespace), True
