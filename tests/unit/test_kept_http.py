"""KeptConnections (backend/kept_http.py) against a local HTTP/1.1 server: connections are
reused, redirects followed, a connection the server closed meanwhile replaced, and error
statuses handed back as answers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from starlight_py.backend.kept_http import MAX_REDIRECTS, KeptConnections


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.paths: list[tuple[str, str | None]] = []
        self.close_after_answer = False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:
        self.server.paths.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/moved"):
            self._answer(307, b"", {"Location": "/here?x=1"})
        elif self.path == "/loop":
            self._answer(307, b"", {"Location": "/loop"})
        elif self.path == "/missing":
            self._answer(404, b'{"reason": "Topic not found"}')
        else:
            self._answer(200, b'{"ok": true}')
        if self.server.close_after_answer:
            self.close_connection = True

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    made = _Server()
    thread = threading.Thread(target=made.serve_forever, daemon=True)
    thread.start()
    yield made
    made.shutdown()
    made.server_close()


def _url(server: _Server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def test_gets_reuse_one_connection(server: _Server) -> None:
    kept = KeptConnections()
    for _ in range(3):
        answer = kept.get(_url(server, "/a"), {"Authorization": "Bearer t"}, 5)
        assert (answer.status, answer.body) == (200, b'{"ok": true}')
    assert server.connections == 1
    assert server.paths == [("/a", "Bearer t")] * 3
    kept.close()


def test_a_redirect_is_followed_with_the_same_headers(server: _Server) -> None:
    answer = KeptConnections().get(_url(server, "/moved"), {"Authorization": "Bearer t"}, 5)
    assert answer.status == 200
    assert server.paths == [("/moved", "Bearer t"), ("/here?x=1", "Bearer t")]


def test_endless_redirects_end_with_the_last_one(server: _Server) -> None:
    answer = KeptConnections().get(_url(server, "/loop"), {}, 5)
    assert answer.status == 307
    assert len(server.paths) == MAX_REDIRECTS + 1


def test_a_connection_closed_by_the_server_is_replaced(server: _Server) -> None:
    kept = KeptConnections()
    server.close_after_answer = True
    for _ in range(3):
        assert kept.get(_url(server, "/a"), {}, 5).status == 200
    assert server.connections == 3


def test_an_error_status_is_an_answer(server: _Server) -> None:
    answer = KeptConnections().get(_url(server, "/missing"), {}, 5)
    assert (answer.status, answer.body) == (404, b'{"reason": "Topic not found"}')


def test_no_server_raises_oserror() -> None:
    with pytest.raises(OSError):
        KeptConnections().get("http://127.0.0.1:9/", {}, 2)
