"""The echo servers ``bench.floor`` measures, each run as a process of its own.

``python -m starlight_py.bench.floor_servers KIND PORT`` serves one of the Python kinds on
127.0.0.1:PORT until it is killed; ``c-epoll`` is a C program this module writes out and
compiles (``build_c_server``). Every server reads what arrives and writes it back at once:
per message, one wake-up from a sleep in the kernel and one write that wakes the client.
"""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import trio

# Not imported from starlight_py.local: that package pulls in pamqp, kazoo and the rest,
# and the servers measured here should hold nothing but their loop.
LOOPBACK = "127.0.0.1"
RECEIVE_SIZE = 65536

C_EPOLL = "c-epoll"
PYTHON_SELECTORS = "python-selectors"
TRIO_STREAM = "trio-stream"
TRIO_LEAN = "trio-lean"
SERVERS = (C_EPOLL, PYTHON_SELECTORS, TRIO_STREAM, TRIO_LEAN)

# The least a server can do per message: one epoll_wait, one recv, one send.
C_SOURCE = r"""
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static char buf[65536];

/* What send() did not take: never with a client that waits for each echo (the echo fits
   the socket's buffer), but the echo stays whole if it happens. */
static int send_rest(int fd, const char *data, ssize_t len) {
    while (len > 0) {
        ssize_t sent = send(fd, data, len, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN) return -1;
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, -1);
            continue;
        }
        data += sent;
        len -= sent;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PORT\n", argv[0]);
        return 2;
    }
    int one = 1;
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(argv[1]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(listener, 16) < 0) {
        perror("bind/listen");
        return 1;
    }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
    struct epoll_event events[64];
    for (;;) {
        int n = epoll_wait(ep, events, 64, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                int conn = accept4(listener, NULL, NULL, SOCK_NONBLOCK);
                if (conn < 0) continue;
                setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                struct epoll_event cev = {.events = EPOLLIN, .data.fd = conn};
                epoll_ctl(ep, EPOLL_CTL_ADD, conn, &cev);
                continue;
            }
            ssize_t got = recv(fd, buf, sizeof buf, 0);
            if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (got <= 0 || send_rest(fd, buf, got) < 0) close(fd);
        }
    }
}
"""


class ServerUnavailable(Exception):
    """This machine cannot run the server (the message says why)."""


def c_compiler() -> str | None:
    """The C compiler on PATH (cc, else gcc), or None."""
    return shutil.which("cc") or shutil.which("gcc")


def build_c_server(directory: Path) -> Path:
    """Compile the ``c-epoll`` server into ``directory``; returns the executable.

    Raises ServerUnavailable when there is no compiler or it fails."""
    compiler = c_compiler()
    if compiler is None:
        raise ServerUnavailable("no C compiler (cc or gcc) on PATH")
    source = directory / "echo_epoll.c"
    binary = directory / "echo_epoll"
    source.write_text(C_SOURCE)
    try:
        result = subprocess.run(
            [compiler, "-O2", "-o", str(binary), str(source)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServerUnavailable(f"{compiler} failed: {e}") from e
    if result.returncode != 0:
        tail = " ".join((result.stderr or result.stdout).split())[-300:]
        raise ServerUnavailable(f"{compiler} failed ({result.returncode}): {tail}")
    return binary


def server_argv(kind: str, port: int, c_binary: Path | None) -> list[str]:
    """The command that serves ``kind`` on ``port`` (``c_binary`` for ``c-epoll``)."""
    if kind == C_EPOLL:
        if c_binary is None:
            raise ValueError("c-epoll needs the compiled binary")
        return [str(c_binary), str(port)]
    if kind not in SERVERS:
        raise ValueError(f"unknown server {kind!r}")
    return [sys.executable, "-m", "starlight_py.bench.floor_servers", kind, str(port)]


# --- python-selectors --------------------------------------------------------------------


def serve_selectors(port: int) -> None:
    """A ``selectors.DefaultSelector`` loop over non-blocking sockets; never returns."""
    listener = socket.create_server((LOOPBACK, port))
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    while True:
        for key, _ in selector.select():
            conn: socket.socket | None = key.data
            if conn is None:
                _accept(selector, listener)
            else:
                _echo(selector, conn)


def _accept(selector: selectors.BaseSelector, listener: socket.socket) -> None:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return
    conn.setblocking(False)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    selector.register(conn, selectors.EVENT_READ, conn)


def _echo(selector: selectors.BaseSelector, conn: socket.socket) -> None:
    try:
        data = conn.recv(RECEIVE_SIZE)
        if data:
            sent = conn.send(data)
            if sent < len(data):
                # Never with a client that waits for each echo (it fits the socket's
                # buffer); blocking for the rest keeps the echo whole if it happens.
                conn.setblocking(True)
                conn.sendall(data[sent:])
                conn.setblocking(False)
            return
    except BlockingIOError:
        return
    except OSError:
        pass  # reset by the client: the same end as a close
    selector.unregister(conn)
    conn.close()


# --- trio ----------------------------------------------------------------------------------


def serve_trio(port: int, lean: bool) -> None:
    """``trio.serve_tcp`` with the stream handler or the lean one; never returns."""

    async def stream_echo(stream: trio.SocketStream) -> None:
        # What trio's stream API costs; the proxy's TLS path reads and writes this way.
        try:
            while data := await stream.receive_some(RECEIVE_SIZE):
                await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # an exception would end serve_tcp, and the server with it

    async def lean_echo(stream: trio.SocketStream) -> None:
        # The proxy's plain-TCP path (gateway/connection/client_connection.py): wait until readable,
        # then read and write the fd without going through the run loop again.
        fd = stream.socket.fileno()
        try:
            while True:
                await trio.lowlevel.wait_readable(fd)
                try:
                    data = os.read(fd, RECEIVE_SIZE)
                except BlockingIOError:
                    continue  # the readiness was stale
                if not data:
                    return
                try:
                    sent = os.write(fd, data)
                except BlockingIOError:
                    sent = 0
                if sent < len(data):
                    await stream.send_all(data[sent:])  # the socket's buffer was full
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # reset by the client

    async def serve() -> None:
        await trio.serve_tcp(lean_echo if lean else stream_echo, port, host=LOOPBACK)

    trio.run(serve)


def main(argv: list[str] | None = None) -> int:
    """``python -m starlight_py.bench.floor_servers KIND PORT``; serves until killed."""
    args = sys.argv[1:] if argv is None else argv
    python_kinds = (PYTHON_SELECTORS, TRIO_STREAM, TRIO_LEAN)
    if len(args) != 2 or args[0] not in python_kinds or not args[1].isdigit():
        print(f"usage: floor_servers {{{','.join(python_kinds)}}} PORT", file=sys.stderr)
        return 2
    kind, port = args[0], int(args[1])
    if kind == PYTHON_SELECTORS:
        serve_selectors(port)
    else:
        serve_trio(port, lean=kind == TRIO_LEAN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
