"""A small client for Pulsar's admin REST API (namespaces now; stats and subscriptions later).

Synchronous on purpose: these calls are off the hot path, and the gateway runs them in a
worker thread (`trio.to_thread.run_sync`). Every failure is translated to `PulsarAdminError`
(the broker answered with an error) or `BackendUnavailable` (no answer at all).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from starlight_py.units import SECONDS


class BackendUnavailable(Exception):
    """Pulsar could not be reached (connection refused, timeout)."""


class PulsarAdminError(Exception):
    """Pulsar answered an admin request with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class PulsarAdmin:
    """Admin REST calls against `web_url` (e.g. http://127.0.0.1:8080)."""

    def __init__(self, web_url: str, timeout: float = 10 * SECONDS) -> None:
        self.web_url = web_url.rstrip("/")
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(
            self.web_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as e:
            raise PulsarAdminError(e.code, _reason(e)) from e
        except (urllib.error.URLError, OSError) as e:
            raise BackendUnavailable(f"Pulsar admin API at {self.web_url} unreachable: {e}") from e
        return json.loads(payload) if payload else None

    def clusters(self) -> list[str]:
        result: list[str] = self._request("GET", "/admin/v2/clusters")
        return result

    def namespaces(self, tenant: str) -> list[str]:
        """Namespaces of a tenant as `tenant/ns`; PulsarAdminError 404 when the tenant is
        missing."""
        result: list[str] = self._request("GET", f"/admin/v2/namespaces/{quote(tenant)}")
        return result

    def namespace_exists(self, tenant: str, namespace: str) -> bool:
        try:
            return f"{tenant}/{namespace}" in self.namespaces(tenant)
        except PulsarAdminError as e:
            if e.status == 404:
                return False
            raise

    def create_tenant(self, tenant: str) -> None:
        """Create a tenant allowed on every cluster; an existing tenant is not an error."""
        body = {"allowedClusters": self.clusters(), "adminRoles": []}
        try:
            self._request("PUT", f"/admin/v2/tenants/{quote(tenant)}", body)
        except PulsarAdminError as e:
            if e.status != 409:
                raise

    def create_namespace(self, tenant: str, namespace: str) -> None:
        """Create a namespace (and its tenant when missing); existing ones are not errors."""
        try:
            self._request("PUT", f"/admin/v2/namespaces/{quote(tenant)}/{quote(namespace)}")
        except PulsarAdminError as e:
            if e.status == 409:
                return
            if e.status != 404:
                raise
            self.create_tenant(tenant)
            try:
                self._request("PUT", f"/admin/v2/namespaces/{quote(tenant)}/{quote(namespace)}")
            except PulsarAdminError as again:
                if again.status != 409:
                    raise


def _reason(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read() or b"{}")
    except (ValueError, OSError):
        return str(error.reason)
    if isinstance(body, dict) and "reason" in body:
        return str(body["reason"])
    return str(error.reason)
