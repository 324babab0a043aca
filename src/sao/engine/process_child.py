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
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple] = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone: shut down
                message = ("close",)
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message[0] == "close":
                return

    threading.Thread(target=read, name="sao-engine-pipe", daemon=True).start()
    tasks: dict[int, asyncio.Task] = {}
    shared: SharedWeights | None = None

    def send(message: tuple) -> None:
        with contextlib.suppress(OSError, ValueError):  # the parent is gone; the read thread ends the loop
            conn.send(message)

    async def generate(rid: int, prompt: list[int], params: SamplingParams) -> None:
        try:
            generation = await engine.generate(prompt, params)
        except asyncio.CancelledError:
            return
        except InvalidRequestError as err:
            send(("invalid", rid, str(err), engine.stats()))
            return
        except Exception as err:  # the engine failed this request: report it as the request's error
            generation = Generation([], [], [], "error", error=f"engine process: {err!r}")
        finally:
            tasks.pop(rid, None)
        send(("result", rid, generation, engine.stats()))

    async def update(rid: int, version: int, payload: Any) -> None:
        nonlocal shared
        error = None
        try:
            if isinstance(payload, SharedWeights):
                shared = payload.attach()
            if isinstance(payload, str):
                await engine.update_weights(payload, version)
            elif shared is None:
                raise RuntimeError("no shared weights were sent before this update")
            else:
                await engine.update_weights(shared.tensors(), version)
        except Exception as err:
            if isinstance(payload, SharedWeights):
                shared = None
            error = (type(err).__name__, str(err))
        send(("updated", rid, error, engine.stats()))

    async def score(rid: int, token_ids: list[int]) -> None:
        try:
            answer: dict[str, Any] = {"logprobs": await engine.score(token_ids)}
        except asyncio.CancelledError:
            return
        except Exception as err:
            answer = {"error": f"{type(err).__name__}: {err}"}
        finally:
            tasks.pop(rid, None)
        send(("scored", rid, answer, engine.stats()))

    while True:
        message = await inbox.get()
        kind = message[0]
        if kind == "generate":
            tasks[message[1]] = asyncio.create_task(generate(*message[1:]))
        elif kind == "cancel":
            task = tasks.get(message[1])
            if task is not None:
                task.cancel()
        elif kind == "update":
            await update(*message[1:])
        elif kind == "score":  # a task, like a generation: scoring runs beside the engine loop
            tasks[message[1]] = asyncio.create_task(score(*message[1:]))
        elif kind == "close":
            break
    await engine.close()  # pending requests finish with "abort" and are sent back
    if tasks:
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    send(("closed", engine.stats()))


if __name__ == "__main__":
    _child_main(Connection(int(sys.argv[1])))
