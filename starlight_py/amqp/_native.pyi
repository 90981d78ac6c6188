"""Types of the compiled per-message frame work (native/src/lib.rs)."""

from typing import Any

def scan(
    buffer: bytearray, size_limit: int, max_message_size: int
) -> tuple[list[tuple[Any, ...]], int]: ...
def encode_deliver(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    raw_properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes: ...
def bind(addresses: list[int]) -> None: ...

class Sender:
    def __init__(self, producer: int) -> None: ...
    def add(self, body: object, properties: dict[str, str]) -> bool: ...
    def send_pending(self) -> int: ...
    @property
    def pending(self) -> int: ...
    def discard(self) -> int: ...
