"""Runs `starlight-admin` in-process (its `main(argv)`) against the test services, with a
metadata root of its own so that tests do not see each other's vhosts."""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from dataclasses import dataclass
from typing import Any

from starlight_py.admin.cli import main
from starlight_py.local import ServiceEndpoints


@dataclass(frozen=True)
class AdminResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class AdminCLI:
    def __init__(self, services: ServiceEndpoints, root: str | None = None) -> None:
        self.root = root or f"/admin-test-{uuid.uuid4().hex[:10]}"
        self.settings = {
            "configurationStoreServers": services.zookeeper,
            "brokerServiceURL": services.pulsar_service_url,
            "brokerWebServiceURL": services.pulsar_web_url,
            "starlightMetadataRoot": self.root,
        }

    @property
    def proxy_settings(self) -> dict[str, str]:
        """Overrides for `start_proxy` so the proxy shares this metadata root."""
        return {"starlightMetadataRoot": self.root}

    def run(self, *args: str, **settings: str) -> AdminResult:
        argv: list[str] = []
        for key, value in {**self.settings, **settings}.items():
            argv += ["--set", f"{key}={value}"]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*argv, *args])
        return AdminResult(code, out.getvalue(), err.getvalue())

    def ok(self, *args: str) -> AdminResult:
        result = self.run(*args)
        assert result.code == 0, f"{args}: exit {result.code}: {result.err}"
        return result

    def json(self, *args: str) -> Any:
        return self.ok("--json", *args).json()
