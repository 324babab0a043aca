"""Resolving an asyncio future from another thread: how engine threads hand results to callers' loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["threadsafe_setter"]


def threadsafe_setter(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> Callable[[Any], None]:
    """A callable any thread may call once to resolve ``future`` (an exception instance is raised there)."""

    def settle(result: Any) -> None:
        if future.done():
            return
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    def deliver(result: Any) -> None:
        # RuntimeError: the caller's event loop is closed, nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result)

    return deliver
