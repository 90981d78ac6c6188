"""logFormat=text|json: the fields of a JSON line, and the connection id a record gets from
the connection's tasks."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import trio

from starlight_py.structured_logging import configure_logging, current_connection


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def records(stream: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_have_the_fields_log_shippers_need(restore_root_logger: None) -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream)
    log = logging.getLogger("starlight.test")
    log.info("hello %s", "world")
    log.debug("not at INFO")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("it failed")
    first, second = records(stream)
    assert set(first) == {"timestamp", "level", "logger", "message"}
    assert first["level"] == "INFO"
    assert first["logger"] == "starlight.test"
    assert first["message"] == "hello world"
    assert first["timestamp"].endswith("+00:00")
    assert second["level"] == "ERROR"
    assert second["message"] == "it failed"
    assert "Traceback" in second["exception"] and "RuntimeError: boom" in second["exception"]


def test_the_connection_id_comes_from_an_adapter_or_the_context(
    restore_root_logger: None,
) -> None:
    stream = io.StringIO()
    configure_logging("DEBUG", "json", stream)
    log = logging.getLogger("starlight.test")
    logging.LoggerAdapter(log, {"conn": "conn-7"}).info("from the adapter")
    log.info("outside any connection")

    async def connection(conn_id: str) -> None:
        current_connection.set(conn_id)

        async def child() -> None:
            await trio.sleep(0)
            log.info("from a child task")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection, "conn-8")
            nursery.start_soon(connection, "conn-9")
        log.info("after the connections")

    trio.run(main)
    lines = records(stream)
    assert lines[0]["connection"] == "conn-7"
    assert "connection" not in lines[1]
    assert sorted(r["connection"] for r in lines[2:4]) == ["conn-8", "conn-9"]
    assert "connection" not in lines[4]


def test_text_format_is_one_readable_line(restore_root_logger: None) -> None:
    stream = io.StringIO()
    configure_logging("WARNING", "text", stream)
    logging.getLogger("starlight.test").warning("careful")
    logging.getLogger("starlight.test").info("quiet")
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" WARNING starlight.test careful")


def test_unknown_format_is_refused(restore_root_logger: None) -> None:
    with pytest.raises(ValueError, match="xml"):
        configure_logging("INFO", "xml")
