"""Runs a proxy in-process (trio in a background thread) for tests that need their own
configuration; stop() cancels it and joins the thread."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

import trio

from starlight_py.config import StarlightConfig, load_config
from starlight_py.gateway.server import serve


class ProxyThread:
    def __init__(self, config: StarlightConfig) -> None:
        self.config = config
        self.url = ""
        self.urls: list[str] = []
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._thread = threading.Thread(target=self._run, name="proxy", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._scope = scope
                async with trio.open_nursery() as nursery:
                    urls = await nursery.start(serve, self.config)
                    self.urls = urls
                    self.url = urls[0]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    self._ready.set()

        try:
            trio.run(main)
        except BaseException as e:  # surfaced by start()
            self._error = e
        finally:
            self._ready.set()

    def start(self) -> ProxyThread:
        self._thread.start()
        # Generous: on a loaded CI machine the start-up checks of the brokers (admin calls)
        # and ZooKeeper's session can take tens of seconds.
        if not self._ready.wait(120):
            raise RuntimeError("proxy did not start within 120 s")
        if self._error is not None:
            raise RuntimeError("proxy failed to start") from self._error
        return self

    def stop(self) -> None:
        if self._token is not None and self._scope is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(15)
        assert not self._thread.is_alive(), "proxy thread did not stop"

    def port_of(self, scheme: str) -> int:
        """The port of the first listener with this scheme (amqp or amqps)."""
        url = next(u for u in self.urls if u.startswith(f"{scheme}://"))
        return int(url.rsplit(":", 1)[1])

    def amqp_url(self, vhost: str = "%2F", **params: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{vhost}" + (f"?{query}" if query else "")


def proxy_config(
    zookeeper: str, pulsar_url: str, pulsar_web_url: str, **overrides: str
) -> StarlightConfig:
    settings: Mapping[str, str] = {
        "configurationStoreServers": zookeeper,
        "brokerServiceURL": pulsar_url,
        "brokerWebServiceURL": pulsar_web_url,
        "amqpListeners": "amqp://127.0.0.1:0",
        "amqpAutoCreateNamespaces": "true",
        **suite_settings(),
        **overrides,
    }
    return load_config(None, {}, settings)


def suite_settings() -> dict[str, str]:
    """Settings every test proxy gets from ``STARLIGHT_TEST_PROXY_SETTINGS``
    (``key=value,key=value``), e.g. ``pulsarProducerBatching=true`` to run the suite with
    batching on (docs/testing.md); a test's own settings win."""
    text = os.environ.get("STARLIGHT_TEST_PROXY_SETTINGS", "")
    pairs = (item.partition("=") for item in text.split(",") if item.strip())
    return {key.strip(): value.strip() for key, _, value in pairs}
