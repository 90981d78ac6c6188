"""Which Pulsar namespace holds a vhost's topics (Starlight-compatible).

`/` or empty -> `<default tenant>/<default namespace>`; `name` or `/name` ->
`<default tenant>/name` (or `name/<default namespace>` with `map_short_to_tenant`);
`tenant/namespace` -> itself. An explicit mapping stored by `starlight-admin` wins over these
rules; that lookup happens in the gateway, these rules are the fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Pulsar's NamedEntity rule for tenant and namespace names.
_PULSAR_NAME = re.compile(r"[-=:.\w]+", re.ASCII)


class InvalidVhostName(ValueError):
    """The vhost name cannot be mapped to a Pulsar namespace."""


@dataclass(frozen=True, slots=True)
class NamespaceName:
    tenant: str
    namespace: str

    def __str__(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @classmethod
    def parse(cls, text: str) -> NamespaceName:
        """Parse `tenant/namespace`; raises InvalidVhostName when it is not valid for Pulsar."""
        tenant, sep, namespace = text.partition("/")
        if not sep:
            raise InvalidVhostName(f"{text!r} is not tenant/namespace")
        return cls(_check(tenant, text), _check(namespace, text))


@dataclass(frozen=True, slots=True)
class NamespaceRules:
    default_tenant: str = "public"
    default_namespace: str = "default"
    map_short_to_tenant: bool = False

    def namespace_for(self, vhost: str) -> NamespaceName:
        """The namespace a vhost maps to by rule; raises InvalidVhostName."""
        name = vhost[1:] if vhost.startswith("/") else vhost
        if not name:
            return NamespaceName(self.default_tenant, self.default_namespace)
        parts = name.split("/")
        if len(parts) == 1:
            short = _check(parts[0], vhost)
            if self.map_short_to_tenant:
                return NamespaceName(short, self.default_namespace)
            return NamespaceName(self.default_tenant, short)
        if len(parts) == 2:
            return NamespaceName(_check(parts[0], vhost), _check(parts[1], vhost))
        raise InvalidVhostName(
            f"vhost {vhost!r} has more than one '/'; use 'tenant/namespace' or map it "
            f"explicitly with starlight-admin vhost create"
        )


def _check(part: str, vhost: str) -> str:
    if not _PULSAR_NAME.fullmatch(part):
        raise InvalidVhostName(
            f"vhost {vhost!r} maps to {part!r}, which is not a valid Pulsar tenant or "
            f"namespace name (letters, digits, '-', '_', '=', ':', '.'); map it explicitly "
            f"with starlight-admin vhost create"
        )
    return part
