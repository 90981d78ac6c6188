"""A stand-in for a chunked Pulsar message in unit tests: pulsar-client prints its id as its
first and last chunks' ids, and reading its position raised before the compiled module
parsed that form."""

from __future__ import annotations

from starlight_py.model.positions import MessageIdRecord


class Chunked:
    """A message of `handle` without a position that compares."""

    def __init__(self, handle: object) -> None:
        self.handle = handle
        self.properties: dict[str, str] = {}

    @property
    def position(self) -> MessageIdRecord:
        raise RuntimeError('an id printed as "(3,1,-1,-1);(3,2,-1,-1)"')
