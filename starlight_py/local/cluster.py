"""A whole starlight cluster on this machine: ZooKeeper, Pulsar, N proxies, HAProxy.

Every part is a separate OS process in its own process group (see :mod:`.process`), so
fault tests can kill a proxy, stop ZooKeeper or restart Pulsar while clients stay
connected through HAProxy, and every part comes back on the same port with the same data.
All ports are picked when the cluster is built and never change.

Layout of ``base_dir``: ``zookeeper/``, ``pulsar/`` (their data and logs), ``proxies/``
(``proxy-<i>.log``), ``haproxy/`` (configuration, log, admin socket).
"""

from __future__ import annotations

import contextlib
import functools
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from starlight_py.local.distribution import Log, log_to_stderr
from starlight_py.local.errors import LocalInfraError
from starlight_py.local.haproxy import HAProxy, server_name
from starlight_py.local.ports import free_port
from starlight_py.local.proxy import ProxyProcess
from starlight_py.local.pulsar import PulsarStandalone
from starlight_py.local.pulsar_cluster import PulsarCluster
from starlight_py.local.zookeeper import ZooKeeperServer
from starlight_py.units import MILLISECONDS, SECONDS

_PROXY_STOP_GRACE = 15 * SECONDS
_SIGNALS_THAT_END = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


def distinct_free_ports(count: int, taken: Sequence[int] = ()) -> list[int]:
    """``count`` free loopback ports, different from each other and from ``taken``.

    Raises:
        OSError: the loopback interface refuses to bind.
    """
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        # The kernel may hand out a port it just gave us once the probe socket is closed.
        if port not in ports and port not in taken:
            ports.append(port)
    return ports


class LocalCluster:
    """ZooKeeper, Pulsar standalone, ``proxies`` proxy processes and HAProxy in front.

    ``proxy_settings`` are configuration keys given to every proxy (``--set``), e.g.
    ``{"zooKeeperSessionTimeoutMillis": "4000"}``; the ZooKeeper, Pulsar and listener keys
    are set by the cluster. Ports left as None are picked at construction.
    """

    def __init__(
        self,
        base_dir: Path,
        proxies: int = 3,
        *,
        port: int | None = None,
        proxy_ports: Sequence[int] | None = None,
        zookeeper_port: int | None = None,
        pulsar_port: int | None = None,
        pulsar_web_port: int | None = None,
        proxy_settings: Mapping[str, str] | None = None,
        check_interval: float = 500 * MILLISECONDS,
        balance: str = "roundrobin",
        distribution: Path | None = None,
        log: Log = log_to_stderr,
        brokers: int = 1,
        bookies: int = 1,
        broker_settings: Mapping[str, str] | None = None,
    ) -> None:
        """One broker and one bookie (the default) run as Pulsar standalone; more run as a
        real Pulsar cluster (:class:`PulsarCluster`) whose metadata lives in the cluster's
        ZooKeeper, with ``broker_settings`` in each broker's broker.conf.

        Raises ValueError: fewer than one proxy, ``proxy_ports`` of another length,
        ``proxy_settings`` naming a key the cluster sets itself, or fewer than one broker or
        bookie."""
        if proxies < 1:
            raise ValueError("a cluster needs at least one proxy")
        if proxy_ports is not None and len(proxy_ports) != proxies:
            raise ValueError(f"{len(proxy_ports)} proxy ports given for {proxies} proxies")
        self.base_dir = base_dir.resolve()
        self._log = log
        fixed = [
            p
            for p in (port, zookeeper_port, pulsar_port, pulsar_web_port, *(proxy_ports or ()))
            if p is not None
        ]
        # Enough for every port left open; the ones not needed are simply not used.
        spare = iter(distinct_free_ports(4 + proxies, fixed))

        def chosen(value: int | None) -> int:
            return value if value is not None else next(spare)

        self.zookeeper = ZooKeeperServer(
            self.base_dir / "zookeeper", chosen(zookeeper_port), distribution=distribution, log=log
        )
        self.pulsar: PulsarStandalone | PulsarCluster
        if brokers == 1 and bookies == 1:
            self.pulsar = PulsarStandalone(
                self.base_dir / "pulsar",
                chosen(pulsar_port),
                chosen(pulsar_web_port),
                distribution=distribution,
                log=log,
            )
        else:
            self.pulsar = PulsarCluster(
                self.base_dir / "pulsar",
                self.zookeeper.connect_string,
                brokers=brokers,
                bookies=bookies,
                distribution=distribution,
                log=log,
                extra_properties=broker_settings,
            )
        ours = {
            "configurationStoreServers": self.zookeeper.connect_string,
            "brokerServiceURL": self.pulsar.service_url,
            "brokerWebServiceURL": self.pulsar.web_url,
        }
        clashes = sorted(set(ours) & set(proxy_settings or {}))
        if clashes:
            raise ValueError(f"the cluster sets {', '.join(clashes)} itself")
        settings = {"amqpAutoCreateNamespaces": "true", **(proxy_settings or {}), **ours}
        self.proxies = [
            ProxyProcess(
                f"proxy {index}",
                self.base_dir / "proxies" / f"proxy-{index}.log",
                settings,
                chosen(proxy_ports[index] if proxy_ports is not None else None),
                log=log,
            )
            for index in range(proxies)
        ]
        self.haproxy = HAProxy(
            self.base_dir / "haproxy",
            [proxy.port for proxy in self.proxies],
            chosen(port),
            check_interval=check_interval,
            balance=balance,
            log=log,
        )

    # --- where things are --------------------------------------------------------------

    @property
    def amqp_url(self) -> str:
        """Through HAProxy: ``amqp://guest:guest@127.0.0.1:<port>/%2F``."""
        return self.haproxy.amqp_url

    @property
    def port(self) -> int:
        """HAProxy's AMQP port."""
        return self.haproxy.port

    def proxy_url(self, index: int) -> str:
        """Proxy ``index`` directly, bypassing HAProxy. Raises IndexError."""
        return self.proxies[index].url

    def haproxy_server_name(self, index: int) -> str:
        """HAProxy's name for proxy ``index`` (for :meth:`HAProxy.wait_until_server`)."""
        return server_name(index)

    @property
    def proxy_pids(self) -> list[int | None]:
        """Pid of each proxy process, None for a stopped one."""
        return [proxy.pid for proxy in self.proxies]

    def summary(self) -> list[str]:
        """One line per address an operator may want, for printing. Raises nothing."""
        lines = [
            f"AMQP (HAProxy): {self.amqp_url}",
            *(
                f"proxy {index}: {proxy.url} (log: {proxy.log_path})"
                for index, proxy in enumerate(self.proxies)
            ),
            *(
                [
                    f"Pulsar: {self.pulsar.service_url}, admin {self.pulsar.web_url} "
                    f"(log: {self.pulsar.log_path})"
                ]
                if isinstance(self.pulsar, PulsarStandalone)
                else self.pulsar.summary()
            ),
            f"ZooKeeper: {self.zookeeper.connect_string} (log: {self.zookeeper.log_path})",
            f"HAProxy: admin socket {self.haproxy.stats_socket} (log: {self.haproxy.log_path})",
        ]
        return lines

    def not_running(self) -> list[str]:
        """Names of the parts whose process is not running (e.g. a crashed proxy).

        Raises nothing.
        """
        parts: list[tuple[str, bool]] = [
            ("ZooKeeper", self.zookeeper.is_running()),
            *(
                (("Pulsar", self.pulsar.is_running()),)
                if isinstance(self.pulsar, PulsarStandalone)
                else ((name, False) for name in self.pulsar.not_running())
            ),
            *((proxy.name, proxy.is_running()) for proxy in self.proxies),
            ("HAProxy", self.haproxy.is_running()),
        ]
        return [name for name, running in parts if not running]

    # --- the whole cluster -------------------------------------------------------------

    def start(self) -> None:
        """Start whatever is not running and return once clients can use every proxy
        through HAProxy. Also resumes paused proxies, so after a fault test ``start()``
        brings the cluster back to full health.

        Raises:
            LocalInfraError: a part could not be started; everything is stopped then.
        """
        started = time.monotonic()
        self._log(f"starting a local cluster of {len(self.proxies)} proxies in {self.base_dir}")
        try:
            self.zookeeper.start()
            self.pulsar.start()
            for proxy in self.proxies:
                # Harmless to a running proxy; wakes one a test froze with SIGSTOP.
                proxy.send_signal(signal.SIGCONT)
            # Python start-up dominates; let the proxies do it side by side.
            for proxy in self.proxies:
                proxy.launch()
            for proxy in self.proxies:
                proxy.wait_until_ready()
            self.haproxy.start()
            self.haproxy.wait_until_servers_up(len(self.proxies))
        except BaseException:
            with contextlib.suppress(LocalInfraError):
                self.stop()
            raise
        self._log(f"local cluster ready after {time.monotonic() - started:.1f} s")

    def stop(self) -> None:
        """Stop everything (HAProxy, the proxies, Pulsar, ZooKeeper); idempotent.

        Data stays in ``base_dir``. Every part is stopped even when one fails to.

        Raises:
            LocalInfraError: a process survived SIGKILL (the first such error).
        """
        errors: list[LocalInfraError] = []

        def attempt(action: Callable[[], None]) -> None:
            try:
                action()
            except LocalInfraError as e:
                errors.append(e)

        attempt(self.haproxy.stop)
        # All proxies shut down at once: each waits a little for ZooKeeper and Pulsar.
        for proxy in self.proxies:
            proxy.send_signal(signal.SIGCONT)
            proxy.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _PROXY_STOP_GRACE
        for proxy in self.proxies:
            try:
                proxy.wait_exited(max(0.0, deadline - time.monotonic()))
            except LocalInfraError:
                # Past the grace period: SIGKILL (a second SIGTERM would only cut the drain
                # short, and the drain is already over by now).
                attempt(functools.partial(proxy.stop, 0))
        attempt(self.pulsar.stop)
        attempt(self.zookeeper.stop)
        if errors:
            raise errors[0]

    # --- faults ------------------------------------------------------------------------

    def kill_proxy(
        self, index: int, sig: signal.Signals = signal.SIGKILL, *, wait: bool = True
    ) -> None:
        """Send ``sig`` to proxy ``index``; by default wait until it has exited.

        HAProxy notices within two health-check intervals; use
        ``haproxy.wait_until_server(haproxy_server_name(index), up=False)`` to wait for it.

        Raises:
            IndexError: no such proxy.
            ValueError: ``wait`` with a signal that does not end a process (e.g. SIGSTOP).
            LocalInfraError: ``wait`` and it did not exit within 30 s.
        """
        proxy = self.proxies[index]
        if wait and sig not in _SIGNALS_THAT_END:
            raise ValueError(f"{sig.name} does not end a proxy; pass wait=False")
        proxy.send_signal(sig)
        if wait:
            proxy.wait_exited()

    def pause_proxy(self, index: int) -> None:
        """Freeze proxy ``index`` (SIGSTOP): it keeps its sockets but answers nothing, like
        a hung process. Raises IndexError."""
        self.proxies[index].send_signal(signal.SIGSTOP)

    def resume_proxy(self, index: int) -> None:
        """Undo :meth:`pause_proxy` (SIGCONT). Raises IndexError."""
        self.proxies[index].send_signal(signal.SIGCONT)

    def start_proxy(self, index: int, *, wait_for_haproxy: bool = True) -> None:
        """Start proxy ``index`` again on its port; by default also wait until HAProxy's
        health check sees it up. A no-op for a running proxy.

        Raises:
            IndexError: no such proxy.
            LocalInfraError: it did not start, or HAProxy did not mark it up within 30 s.
        """
        self.proxies[index].start()
        if wait_for_haproxy and self.haproxy.is_running():
            self.haproxy.wait_until_server(server_name(index), up=True)

    def stop_zookeeper(self) -> None:
        """Stop ZooKeeper (data kept). Raises LocalInfraError if it survives SIGKILL."""
        self.zookeeper.stop()

    def start_zookeeper(self) -> None:
        """Start ZooKeeper again on the same port with the same data.

        Raises:
            LocalInfraError: it did not start.
        """
        self.zookeeper.start()

    def stop_pulsar(self) -> None:
        """Stop Pulsar (data kept). Raises LocalInfraError if it survives SIGKILL."""
        self.pulsar.stop()

    def start_pulsar(self) -> None:
        """Start Pulsar again on the same ports with the same data (topics, messages).

        Raises:
            LocalInfraError: it did not start.
        """
        self.pulsar.start()

    def restart_pulsar(self) -> None:
        """:meth:`stop_pulsar`, then :meth:`start_pulsar`.

        Raises:
            LocalInfraError: as those two.
        """
        self.stop_pulsar()
        self.start_pulsar()

    def __enter__(self) -> LocalCluster:
        """Start (see :meth:`start`, which raises LocalInfraError) and return self."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop; raises LocalInfraError only if a process survives SIGKILL."""
        self.stop()
