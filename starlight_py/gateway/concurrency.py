"""Awaiting several calls at once, with errors as the AMQP error mapping expects them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

__all__ = ["concurrently"]


async def concurrently(*calls: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Await calls at once; their results in order. The first call's exception wins (it
    says why the others do not matter, say a queue not found), then the others' in order;
    nothing is wrapped in an exception group."""
    results: list[Any] = [None] * len(calls)
    errors: list[Exception | None] = [None] * len(calls)

    async def one(index: int) -> None:
        try:
            results[index] = await calls[index]()
        except Exception as e:
            errors[index] = e

    async with trio.open_nursery() as nursery:
        for index in range(len(calls)):
            nursery.start_soon(one, index)
    for error in errors:
        if error is not None:
            raise error
    return results
