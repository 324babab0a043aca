"""The engine process of `sao.engine.process.ProcessEngine`: ``python -m sao.engine.process_child FD``.

Reads its `LocalEngine` options from the socket ``FD``, loads the engine, reports ``ready`` (or the
traceback) and serves the parent's messages (the protocol is in `sao.engine.process`) until ``close`` or
until the parent's end of the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch

from sao.engine.shared_weights import SharedWeights
from sao.engine.types import Generation, InvalidRequestError, SamplingParams

__all__: list[str] = []


def _child_main(conn: Connection) -> None:
    """Entry point of the engine process: read the options, load the engine, report ready (or the
    traceback), serve until closed."""
    try:
        _, options, threads, logging = conn.recv()
        if threads is not None:
            torch.set_num_threads(threads)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity(logging["verbosity"])
        if not logging["progress_bar"]:
            hf_logging.disable_progress_bar()
        from sao.engine.local import LocalEngine

        engine = LocalEngine(**options)
        engine.start()
    except BaseException:
        with contextlib.suppress(OSError, ValueError):
            conn.send(("failed", traceback.format_exc()))
        conn.close()
        return
    info = {
        "vocab_size": engine.vocab_size,
        "context_limit": engine.context_limit,
        "has_tokenizer": engine.tokenizer is not None,
        "version": engine.version,
        "stats": engine.stats(),
    }
    conn.send(("ready", info))
    asyncio.run(_serve(conn, engine))
    conn.close()


async def _serve(conn: Connection, engine: Any) -> None:
    """Dispatch the parent's messages to ``engine`` until ``close`` (or the parent's end of the pipe
    closes). Only this event loop's thread sends; a reader thread receives."""
    await _Server(conn, engine).run()


class _Server:
    """The child's side of the protocol: an inbox filled by a reader thread, one task per generation or
    scoring request (so ``cancel`` can reach it), weight updates in message order, and ``send``, which
    only this event loop's thread calls."""

    def __init__(self, conn: Connection, engine: Any) -> None:
        self.conn, self.engine = conn, engine
        self.inbox: asyncio.Queue[tuple] = asyncio.Queue()
        self.tasks: dict[int, asyncio.Task] = {}
        self.shared: SharedWeights | None = None

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        """The reader thread: every message into the inbox; ``close`` when the parent is gone."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the parent is gone: shut down
                message = ("close",)
            loop.call_soon_threadsafe(self.inbox.put_nowait, message)
            if message[0] == "close":
                return

    def send(self, message: tuple) -> None:
        with contextlib.suppress(OSError, ValueError):  # the parent is gone; the read thread ends the loop
            self.conn.send(message)

    async def run(self) -> None:
        """Serve until ``close``, then close the engine and send back what was pending."""
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, args=(loop,), name="sao-engine-pipe", daemon=True).start()
        while True:
            message = await self.inbox.get()
            kind = message[0]
            if kind == "generate":
                self.tasks[message[1]] = asyncio.create_task(self.generate(*message[1:]))
            elif kind == "cancel":
                task = self.tasks.get(message[1])
                if task is not None:
                    task.cancel()
            elif kind == "update":
                await self.update(*message[1:])
            elif kind == "score":  # a task, like a generation: scoring runs beside the engine loop
                self.tasks[message[1]] = asyncio.create_task(self.score(*message[1:]))
            elif kind == "close":
                break
        await self.engine.close()  # pending requests finish with "abort" and are sent back
        if self.tasks:
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.send(("closed", self.engine.stats()))

    async def generate(self, rid: int, prompt: list[int], params: SamplingParams) -> None:
        engine = self.engine
        try:
            generation = await engine.generate(prompt, params)
        except asyncio.CancelledError:
            return
        except InvalidRequestError as err:
            self.send(("invalid", rid, str(err), engine.stats()))
            return
        except Exception as err:  # the engine failed this request: report it as the request's error
            generation = Generation([], [], [], "error", error=f"engine process: {err!r}")
        finally:
            self.tasks.pop(rid, None)
        self.send(("result", rid, generation, engine.stats()))

    async def update(self, rid: int, version: int, payload: Any) -> None:
        """New weights: a checkpoint path, or the shared tensors (attached on first sight)."""
        error = None
        try:
            if isinstance(payload, SharedWeights):
                self.shared = payload.attach()
            if isinstance(payload, str):
                await self.engine.update_weights(payload, version)
            elif self.shared is None:
                raise RuntimeError("no shared weights were sent before this update")
            else:
                await self.engine.update_weights(self.shared.tensors(), version)
        except Exception as err:
            if isinstance(payload, SharedWeights):
                self.shared = None
            error = (type(err).__name__, str(err))
        self.send(("updated", rid, error, self.engine.stats()))

    async def score(self, rid: int, token_ids: list[int]) -> None:
        try:
            answer: dict[str, Any] = {"logprobs": await self.engine.score(token_ids)}
        except asyncio.CancelledError:
            return
        except Exception as err:
            answer = {"error": f"{type(err).__name__}: {err}"}
        finally:
            self.tasks.pop(rid, None)
        self.send(("scored", rid, answer, self.engine.stats()))


if __name__ == "__main__":
    _child_main(Connection(int(sys.argv[1])))
