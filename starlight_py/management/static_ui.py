"""The management web UI's static files (starlight_py/management/ui/, shipped as package
data): `/` is the page, `/ui/<file>` its script and style sheet. Served without a login, as
RabbitMQ serves its UI: the page asks for credentials and sends them to the API itself
(docs/management.md#web-ui). Every other request goes to the API.
"""

from __future__ import annotations

from importlib import resources
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from starlight_py.management.http_server import Handler, HttpRequest, HttpResponse

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# The page loads only its own files and talks only to its own API; no inline script, so
# a name that slipped into the page as markup could not run.
SECURITY_HEADERS = (
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-cache"),
)
INDEX = "index.html"


def load_ui_files() -> dict[str, bytes]:
    """The UI's files by name ("index.html", "app.js", ...), read once."""
    folder = resources.files("starlight_py.management").joinpath("ui")
    return {
        entry.name: entry.read_bytes()
        for entry in folder.iterdir()
        if entry.is_file() and PurePosixPath(entry.name).suffix in CONTENT_TYPES
    }


def ui_response(files: dict[str, bytes], method: str, target: str) -> HttpResponse | None:
    """The answer to a request for one of the UI's files, or None when `target` is not one
    (the API answers it). Pure."""
    if method not in ("GET", "HEAD"):
        return None
    path = urlsplit(target).path
    if path in ("/", f"/{INDEX}"):
        name = INDEX
    elif path.startswith("/ui/") and path.count("/") == 2:
        name = path.removeprefix("/ui/")
    else:
        return None
    body = files.get(name)
    if body is None:
        return None
    content_type = CONTENT_TYPES[PurePosixPath(name).suffix]
    return HttpResponse(200, body, (("content-type", content_type), *SECURITY_HEADERS))


def with_ui(api: Handler) -> Handler:
    """`api`, with the UI's files served in front of it."""
    files = load_ui_files()

    async def handle(request: HttpRequest) -> HttpResponse:
        return ui_response(files, request.method, request.target) or await api(request)

    return handle
