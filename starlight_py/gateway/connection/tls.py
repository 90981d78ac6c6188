"""TLS for amqps:// listeners: the server SSLContext, its reload when the files change, and
the handshake of each accepted connection, bounded by a timeout.

The listener only wraps accepted sockets (no I/O in `accept`), so a client that connects
and never speaks TLS occupies its own connection task until `tlsHandshakeTimeoutMillis`,
never the accept loop or another client.

Reload: at most every `tlsCertRefreshCheckDurationSec` an accept looks at the files'
(mtime, size, inode); when they changed a new SSLContext is built for connections accepted
from then on. Connections already open keep the context they were accepted with. A new
context that cannot be built (a certificate half written, a key that does not match) is
logged and the previous one stays in use.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from typing import Any

import trio

from starlight_py.config import ConfigError, StarlightConfig

log = logging.getLogger("starlight.tls")

_VERSIONS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}


class TlsSetupError(Exception):
    """The TLS files or settings cannot make a working SSLContext; `key` names the setting."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class TlsSettings:
    certificate_file: str
    key_file: str
    trust_certs_file: str = ""
    require_client_cert: bool = False
    protocols: tuple[str, ...] = ("TLSv1.3", "TLSv1.2")
    ciphers: tuple[str, ...] = ()
    handshake_timeout: float = 5.0
    refresh_interval: float = 300.0

    @classmethod
    def from_config(cls, config: StarlightConfig) -> TlsSettings:
        return cls(
            config.tls_certificate_file,
            config.tls_key_file,
            config.tls_trust_certs_file,
            config.tls_require_client_cert,
            config.tls_protocols,
            config.tls_ciphers,
            config.tls_handshake_timeout,
            config.tls_cert_refresh_interval,
        )

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.certificate_file, self.key_file, self.trust_certs_file) if f)


def build_server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A server SSLContext from the settings. Raises TlsSetupError saying what is wrong."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_VERSIONS[p] for p in settings.protocols)
    try:
        context.minimum_version = versions[0]
        context.maximum_version = versions[-1]
    except ValueError as e:
        raise TlsSetupError("tlsProtocols", str(e)) from e
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if settings.ciphers:
        try:
            context.set_ciphers(":".join(settings.ciphers))
        except ssl.SSLError as e:
            raise TlsSetupError("tlsCiphers", f"no usable cipher in {settings.ciphers}") from e
    try:
        context.load_cert_chain(settings.certificate_file, settings.key_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsSetupError(
            "tlsCertificateFilePath",
            f"cannot load tlsCertificateFilePath {settings.certificate_file} with "
            f"tlsKeyFilePath {settings.key_file}: {e}",
        ) from e
    if settings.trust_certs_file:
        try:
            context.load_verify_locations(cafile=settings.trust_certs_file)
        except (OSError, ssl.SSLError) as e:
            raise TlsSetupError(
                "tlsTrustCertsFilePath",
                f"cannot load tlsTrustCertsFilePath {settings.trust_certs_file}: {e}",
            ) from e
        # CERT_OPTIONAL still refuses a certificate the CAs did not sign; it only lets a
        # client without one through (to PLAIN, or to a refused EXTERNAL).
        context.verify_mode = (
            ssl.CERT_REQUIRED if settings.require_client_cert else ssl.CERT_OPTIONAL
        )
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


class ReloadingServerContext:
    """The SSLContext for the next accepted connection, rebuilt when the files change."""

    def __init__(self, settings: TlsSettings) -> None:
        """Raises TlsSetupError when the first context cannot be built."""
        self.settings = settings
        self._stamps = self._file_stamps()
        self._context = build_server_context(settings)
        self._checked_at = trio.current_time()
        self.reloads = 0

    def current(self) -> ssl.SSLContext:
        now = trio.current_time()
        if now - self._checked_at < self.settings.refresh_interval:
            return self._context
        self._checked_at = now
        stamps = self._file_stamps()
        if stamps != self._stamps:
            try:
                context = build_server_context(self.settings)
            except TlsSetupError as e:
                log.warning("TLS files changed but cannot be used (keeping the old ones): %s", e)
            else:
                self._context = context
                self._stamps = stamps
                self.reloads += 1
                log.info("TLS certificate files changed: new connections use them")
        return self._context

    def _file_stamps(self) -> tuple[tuple[float, int, int] | None, ...]:
        stamps: list[tuple[float, int, int] | None] = []
        for path in self.settings.files:
            try:
                st = os.stat(path)
            except OSError:
                stamps.append(None)
            else:
                stamps.append((st.st_mtime, st.st_size, st.st_ino))
        return tuple(stamps)


class TlsListener(trio.abc.Listener[trio.SSLStream[trio.SocketStream]]):
    """Wraps accepted sockets in an SSLStream with the current context; the handshake happens
    in the connection's own task (`complete_handshake`)."""

    def __init__(self, transport: trio.SocketListener, contexts: ReloadingServerContext) -> None:
        self.transport = transport
        self.contexts = contexts

    @property
    def socket(self) -> Any:
        return self.transport.socket

    async def accept(self) -> trio.SSLStream[trio.SocketStream]:
        stream = await self.transport.accept()
        return trio.SSLStream(stream, self.contexts.current(), server_side=True)

    async def aclose(self) -> None:
        await self.transport.aclose()


async def complete_handshake(
    stream: trio.SSLStream[trio.SocketStream], timeout: float, peer: str
) -> bool:
    """Run the TLS handshake within `timeout`; on failure close the stream and return False."""
    reason = ""
    with trio.move_on_after(timeout) as scope:
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as e:
            cause = e.__cause__
            reason = str(cause) if cause is not None else "connection closed"
    if scope.cancelled_caught:
        reason = f"no TLS handshake within {timeout:g} s"
    if not reason:
        return True
    # A load balancer's TCP health check looks like this too: not worth a warning.
    log.info("TLS handshake with %s failed: %s", peer, reason)
    await trio.aclose_forcefully(stream)
    return False


def peer_certificate(stream: trio.SSLStream[trio.SocketStream]) -> bytes | None:
    """The client certificate (DER) the handshake verified, or None."""
    der = stream.getpeercert(binary_form=True)
    return bytes(der) if der else None


def server_tls(config: StarlightConfig) -> ReloadingServerContext | None:
    """The TLS context of amqps:// listeners, or None when there are none.

    Raises ConfigError when the files cannot be used."""
    if not any(listener.scheme == "amqps" for listener in config.listeners):
        return None
    try:
        return ReloadingServerContext(TlsSettings.from_config(config))
    except TlsSetupError as e:
        raise ConfigError(e.key, str(e)) from e
