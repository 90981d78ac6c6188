"""The web UI's static files: which requests they answer, with which content types."""

from __future__ import annotations

import pytest

from starlight_py.management.static_ui import load_ui_files, ui_response

FILES = {"index.html": b"<html>", "app.js": b"js", "style.css": b"css"}


@pytest.mark.parametrize(
    ("target", "body", "content_type"),
    [
        ("/", b"<html>", "text/html; charset=utf-8"),
        ("/?x=1", b"<html>", "text/html; charset=utf-8"),
        ("/index.html", b"<html>", "text/html; charset=utf-8"),
        ("/ui/app.js", b"js", "text/javascript; charset=utf-8"),
        ("/ui/style.css", b"css", "text/css; charset=utf-8"),
    ],
)
def test_the_ui_files_are_served(target: str, body: bytes, content_type: str) -> None:
    response = ui_response(FILES, "GET", target)
    assert response is not None
    headers = dict(response.headers)
    assert (response.status, response.body, headers["content-type"]) == (200, body, content_type)
    assert headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in headers["content-security-policy"]


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/api/overview"),
        ("GET", "/ui/missing.js"),
        ("GET", "/ui/../index.html"),
        ("GET", "/ui/sub/app.js"),
        ("GET", "/app.js"),
        ("POST", "/"),
        ("DELETE", "/ui/app.js"),
    ],
)
def test_everything_else_goes_to_the_api(method: str, target: str) -> None:
    assert ui_response(FILES, method, target) is None


def test_head_is_answered_like_get() -> None:
    assert ui_response(FILES, "HEAD", "/") == ui_response(FILES, "GET", "/")


def test_the_package_ships_the_page_its_script_and_style() -> None:
    files = load_ui_files()
    assert {"index.html", "app.js", "style.css"} <= set(files)
    assert b'src="ui/app.js"' in files["index.html"]
