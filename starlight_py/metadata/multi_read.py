"""Several znode reads in one ZooKeeper request: `multiRead` (ZooKeeper 3.6 and later).

A queue deletion reads the queue's record, its children, its consumers, its binding sets
and the retired subscriptions before its transaction; a bind reads the exchange, the queue
and the binding set. One at a time, each read is a round trip, a wake-up of the waiting
thread and a request the server passes through its pipeline: on a small machine that is
most of what declaring and deleting a queue costs ZooKeeper and the proxy. ZooKeeper's
`multiRead` takes a list of getData and getChildren requests and answers each one on its
own (a missing znode fails its own read, not the others), as one request.

kazoo has no multiRead; `MultiRead` is the request in kazoo's request shape, sent with the
client's `_call` like its own requests (as the watched tree sends `addWatch`). A server
without it answers UNIMPLEMENTED: ZooKeeperClient.read then reads one znode at a time.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import EXCEPTIONS
from kazoo.protocol.serialization import (
    MultiHeader,
    ZnodeStat,
    bool_struct,
    int_struct,
    multiheader_struct,
    read_buffer,
    read_string,
    stat_struct,
    write_string,
)

__all__ = ["Children", "Data", "MultiRead", "Read", "ReadAnswer"]

MULTI_READ_OP = 22  # ZooKeeper's OpCode.multiRead
GET_DATA_OP = 4  # OpCode.getData
GET_CHILDREN_OP = 8  # OpCode.getChildren
ERROR_OP = -1  # OpCode.error: the header of a read that failed


@dataclass(frozen=True)
class Data:
    """Read a znode's data and version."""

    path: str
    op = GET_DATA_OP


@dataclass(frozen=True)
class Children:
    """Read a znode's child names."""

    path: str
    op = GET_CHILDREN_OP


Read = Data | Children
# Per read, in order: (bytes, ZnodeStat) for Data, list[str] for Children, or the
# exception its read failed with (NoNodeError for a missing znode).
ReadAnswer = tuple[bytes, Any] | list[str] | Exception


class MultiRead(namedtuple("MultiRead", "paths ops")):
    """The multiRead request: `paths` already chrooted, `ops` GET_DATA_OP or
    GET_CHILDREN_OP for each."""

    type = MULTI_READ_OP

    def serialize(self) -> bytearray:
        out = bytearray()
        for path, op in zip(self.paths, self.ops, strict=True):
            out.extend(MultiHeader(op, False, -1).serialize())
            out.extend(write_string(path))
            out.extend(bool_struct.pack(False))  # no watch
        out.extend(multiheader_struct.pack(-1, True, -1))
        return out

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[ReadAnswer]:
        answers: list[ReadAnswer] = []
        header, offset = MultiHeader.deserialize(data, offset)
        while not header.done:
            if header.type == GET_DATA_OP:
                value, offset = read_buffer(data, offset)
                stat = ZnodeStat._make(stat_struct.unpack_from(data, offset))
                offset += stat_struct.size
                answers.append((value if value is not None else b"", stat))
            elif header.type == GET_CHILDREN_OP:
                count = int_struct.unpack_from(data, offset)[0]
                offset += int_struct.size
                names: list[str] = []
                for _ in range(max(count, 0)):
                    name, offset = read_string(data, offset)
                    names.append(name)
                answers.append(names)
            elif header.type == ERROR_OP:
                code = int_struct.unpack_from(data, offset)[0]
                offset += int_struct.size
                answers.append(EXCEPTIONS[code]())
            else:
                raise ValueError(f"multiRead answered an operation of type {header.type}")
            header, offset = MultiHeader.deserialize(data, offset)
        return answers
