"""`ProcessEngine`: the `LocalEngine` in a child process of its own, behind the same `InferenceEngine` API.

Why. In one process the local engine's decode loop (Python work every step) and the trainer's
forward/backward share the interpreter lock, so an asynchronous run overlaps them only partly. With the
engine in its own process (its own interpreter, its own torch threads, ``threads``) generation and training
run truly in parallel, e.g. one CPU core each: the layout the paper and AReaL use with separate devices.

Protocol. The child is ``python -m sao.engine.process_child FD`` (`sao.engine.process_child`); one private
socket pair (a ``multiprocessing`` `Connection`) links them. Parent → child: ``("start", options, threads,
logging)`` (logging: this process's transformers verbosity, copied by the child), ``("generate", rid,
prompt, params)``, ``("cancel", rid)``, ``("update", rid, version, payload)``, ``("score", rid,
token_ids)``, ``("close",)``. Child → parent: ``("ready", info)`` or ``("failed", traceback)`` once at
start, then ``("result", rid, Generation, stats)``, ``("invalid", rid, message, stats)``, ``("updated",
rid, error, stats)``, ``("scored", rid, {"logprobs": [...]} or {"error": message}, stats)`` and
``("closed", stats)``. The parent validates requests itself (`check_request`, with the vocabulary size and
context limit the child reported) so an invalid request fails at once, without a round trip.

Weights. A state dict crosses the pipe once as a few shared-memory buffers (`SharedWeights`: one flat
memory-mapped CPU buffer per dtype; the tensors are views into them); later updates with the same names and
shapes copy into those buffers and send only the version; any other state dict is shared anew; a checkpoint
directory is sent as its path. The parent writes the buffers only while no update is in flight: updates are
serialised and each waits for the child's acknowledgement, which the child sends once its engine has copied
the buffers into the model (`LocalEngine.update_weights`), so the child never reads a half-written buffer.
Versions and in-flight semantics are the local engine's: an update never aborts a request.

Failure. If the child dies, every pending generation finishes with ``finish_reason="error"`` (with the
exit code), later requests too, `update_weights` raises RuntimeError, and ``alive`` turns False (a run's
`SupervisedEngine` then starts a new one). `close` asks the child to close
its engine (pending requests finish with ``"abort"``) and kills it if it does not exit in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from torch import Tensor

from sao.engine.futures import threadsafe_setter
from sao.engine.local_request import check_request
from sao.engine.shared_weights import SharedWeights
from sao.engine.types import Generation, InvalidRequestError, SamplingParams, WeightsLike

__all__ = ["ProcessEngine", "SharedWeights"]

_READY_TIMEOUT_S = 600.0
_CLOSE_TIMEOUT_S = 30.0
# Errors of an update in the child that mean "these weights are wrong" are raised as themselves.
_RAISED_AS: dict[str, type[Exception]] = {
    "ValueError": ValueError, "TypeError": TypeError, "FileNotFoundError": FileNotFoundError
}  # fmt: skip


class ProcessEngine:
    """`InferenceEngine` running a `LocalEngine` in a spawned child process (see the module docstring).

    ``model_path`` and ``tokenizer`` are directories (the child loads them); ``device``, ``dtype``,
    ``max_running``, ``max_kv_tokens``, ``max_model_len``, ``recompute_kv_on_update``, ``seed`` and
    ``prefix_cache_tokens`` are the `LocalEngine` arguments; ``threads`` sets the child's torch intra-op
    threads (None: torch's default).
    The constructor blocks until the child has loaded the model; it raises RuntimeError with the child's
    traceback if loading fails (a bad path, an unknown dtype) and TimeoutError after ``ready_timeout_s``.
    """

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: str | Path | None = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        max_running: int = 32,
        max_kv_tokens: int = 65536,
        max_model_len: int | None = None,
        recompute_kv_on_update: bool = False,
        seed: int = 0,
        threads: int | None = None,
        prefix_cache_tokens: int | None = None,
        ready_timeout_s: float = _READY_TIMEOUT_S,
    ) -> None:
        options = dict(
            model_path_or_model=str(model_path),
            tokenizer=None if tokenizer is None else str(tokenizer),
            device=device, dtype=dtype, max_running=max_running, max_kv_tokens=max_kv_tokens,
            max_model_len=max_model_len, recompute_kv_on_update=recompute_kv_on_update, seed=seed,
            prefix_cache_tokens=prefix_cache_tokens,
        )  # fmt: skip
        # A private socket pair (what multiprocessing.Pipe is), the child's end inherited by fd. A plain
        # subprocess rather than multiprocessing's spawn: spawn re-imports the caller's __main__ script.
        parent_sock, child_sock = socket.socketpair()
        self._conn = Connection(parent_sock.detach())
        child_fd = child_sock.fileno()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "sao.engine.process_child", str(child_fd)],
            pass_fds=(child_fd,), env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        child_sock.close()
        self._conn.send(("start", options, threads, _transformers_logging()))
        info = self._wait_ready(ready_timeout_s)
        self.vocab_size = int(info["vocab_size"])
        self.context_limit = int(info["context_limit"])
        self._has_tokenizer = bool(info["has_tokenizer"])
        self._version = int(info["version"])
        self._stats: dict[str, float] = dict(info["stats"])
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # guards _pending, _closed and _stats
        # request id -> ("generate" | "update" | "score", how to resolve the caller's future)
        self._pending: dict[int, tuple[str, Callable[[Any], None]]] = {}
        self._ids = itertools.count()
        self._closed: str | None = None  # why new requests are refused ("abort" / "error: ...")
        self._closed_event = threading.Event()
        self._weights: SharedWeights | None = None
        self._update_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name="sao-engine-reader", daemon=True)
        self._reader.start()

    # ----------------------------------------------------------------------------------------- public API

    @property
    def version(self) -> int:
        """Policy version of the weights the child's decode steps use now (as of the last acknowledged
        update)."""
        return self._version

    @property
    def alive(self) -> bool:
        """False once the child process has exited or the engine was closed (a supervisor restarts a dead
        engine: `sao.runtime.engine_guard`)."""
        with self._lock:
            closed = self._closed
        return closed is None and self._process.poll() is None

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Generate one completion in the child; raises `InvalidRequestError` for a request it cannot
        serve. A cancelled call cancels the request in the child."""
        prompt = check_request(
            prompt_token_ids, params, self.vocab_size, self.context_limit, self._has_tokenizer
        )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        rid = next(self._ids)
        with self._lock:
            closed = self._closed
            if closed is None:
                self._pending[rid] = ("generate", threadsafe_setter(loop, future))
        if closed is not None:
            return _ended(closed)
        if not self._send(("generate", rid, prompt, params)):
            with self._lock:
                self._pending.pop(rid, None)
            return _ended(self._closed or "error: engine process is gone")
        try:
            return await future
        except asyncio.CancelledError:
            with self._lock:
                self._pending.pop(rid, None)
            self._send(("cancel", rid))
            raise

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        """Load ``weights`` (a state dict or a checkpoint directory) in the child as ``version``; returns
        once the child's next engine step uses them. Raises ValueError for unknown names, wrong shapes or
        a decreasing version (nothing changes then), RuntimeError if the engine process is gone."""
        # A thread lock, not an asyncio one: callers may come from several event loops, and the shared
        # buffers must not be rewritten while the child reads them.
        await asyncio.to_thread(self._update_lock.acquire)
        try:
            await self._update(weights, version)
        finally:
            self._update_lock.release()

    async def _update(self, weights: WeightsLike, version: int) -> None:
        if self._closed is not None:
            raise RuntimeError(f"engine process is closed ({self._closed})")
        if isinstance(weights, (str, Path)):
            payload: Any = str(weights)
        elif not isinstance(weights, Mapping):
            raise TypeError(
                f"weights must be a state dict or a checkpoint directory, got {type(weights).__name__}"
            )
        elif self._weights is not None and self._weights.matches(weights):
            self._weights.write(weights)
            payload = None  # the child reads the buffers it already holds
        else:
            bad = next((n for n, t in weights.items() if not isinstance(t, Tensor)), None)
            if bad is not None:
                raise ValueError(f"state dict entry {bad!r} is not a tensor")
            self._weights = None
            payload = SharedWeights.allocate(weights)
        try:
            if isinstance(payload, SharedWeights):
                payload.write(weights)
            error = await self._send_update(version, payload)
        except asyncio.CancelledError:
            self._weights = None  # the child may still read these buffers: the next update gets new ones
            raise
        finally:
            if isinstance(payload, SharedWeights):
                payload.unlink()  # mapped by the child, or never to be: the names are not needed
        if error is not None:  # (exception class name, message) raised in the child
            if isinstance(payload, SharedWeights):
                self._weights = None
            raise _RAISED_AS.get(error[0], RuntimeError)(error[1])
        if isinstance(payload, SharedWeights):
            self._weights = payload
        self._version = version

    async def _send_update(self, version: int, payload: Any) -> Any:
        """Send one update and wait for the child's answer: None, or (exception class name, message)."""
        return await self._ask("update", version, payload)

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """The child engine's `LocalEngine.score` of ``token_ids``: ``len(token_ids) - 1`` teacher-forced
        log-probs under the weights it holds now. Raises ValueError for invalid ids, RuntimeError if the
        scoring failed in the child or the engine process is gone."""
        from sao.engine.scoring import check_score_ids

        answer = await self._ask("score", check_score_ids(token_ids, self.vocab_size))
        if "error" in answer:
            raise RuntimeError(f"engine process: scoring failed: {answer['error']}")
        return list(answer["logprobs"])

    async def _ask(self, kind: str, *body: Any) -> Any:
        """Send ``(kind, request id, *body)`` to the child and wait for its answer to that id."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        rid = next(self._ids)
        with self._lock:
            if self._closed is not None:
                raise RuntimeError(f"engine process is closed ({self._closed})")
            self._pending[rid] = (kind, threadsafe_setter(loop, future))
        if not self._send((kind, rid, *body)):
            with self._lock:
                self._pending.pop(rid, None)  # nobody will await its future
            raise RuntimeError("engine process is gone")
        return await future

    def stats(self) -> dict[str, float]:
        """The child engine's `LocalEngine.stats` as of its latest message, plus ``process_alive``."""
        with self._lock:
            out = dict(self._stats)
        out["process_alive"] = float(self._process.poll() is None)
        return out

    async def close(self) -> None:
        """Close the child's engine (pending requests finish with ``"abort"``), then end the process
        (killed if it has not exited within 30 s). Idempotent."""
        with self._lock:
            already = self._closed is not None
            if not already:
                self._closed = "abort"
        if not already:
            self._send(("close",))
        await asyncio.to_thread(self._closed_event.wait, _CLOSE_TIMEOUT_S)
        try:
            await asyncio.to_thread(self._process.wait, _CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            await asyncio.to_thread(self._process.wait)
        if self._weights is not None:
            self._weights.unlink()
        self._fail_pending(None)
        self._conn.close()

    async def __aenter__(self) -> ProcessEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -------------------------------------------------------------------------------------- parent side

    def _wait_ready(self, timeout_s: float) -> dict[str, Any]:
        waited = 0.0
        while not self._conn.poll(0.5):
            waited += 0.5
            if self._process.poll() is not None:
                break
            if waited >= timeout_s:
                self._process.kill()
                self._process.wait()
                self._conn.close()
                raise TimeoutError(f"engine process did not load the model within {timeout_s:.0f} s")
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            code = self._process.wait()
            self._conn.close()
            raise RuntimeError(f"engine process exited with code {code} while loading") from None
        if message[0] == "failed":
            self._process.wait(_CLOSE_TIMEOUT_S)
            self._conn.close()
            raise RuntimeError(f"engine process failed to start:\n{message[1]}")
        return message[1]

    def _send(self, message: tuple) -> bool:
        """Send to the child; False when the pipe is closed (the child is gone)."""
        try:
            with self._send_lock:
                self._conn.send(message)
            return True
        except (OSError, ValueError, BrokenPipeError):
            return False

    def _read_loop(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "closed":
                with self._lock:
                    self._stats = dict(message[1])
                break
            rid, value, stats = message[1], message[2], message[3]
            with self._lock:
                self._stats = dict(stats)
                entry = self._pending.pop(rid, None)
            if entry is None:
                continue  # cancelled meanwhile
            # "result": a Generation; "updated": None or (exception class name, message); "invalid": text
            entry[1](InvalidRequestError(value) if kind == "invalid" else value)
        with self._lock:
            died = self._closed is None  # not closed by us
        error = None
        if died:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(5)
            error = f"engine process exited with code {self._process.returncode}"
            with self._lock:
                self._closed = f"error: {error}"
        self._fail_pending(error)
        self._closed_event.set()

    def _fail_pending(self, error: str | None) -> None:
        """Finish every pending call: generations with ``abort`` (``error`` when given), updates with
        RuntimeError."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for kind, deliver in pending.values():
            if kind in ("update", "score"):
                deliver(RuntimeError(error or f"engine process closed before the {kind} took effect"))
            else:
                deliver(_ended(f"error: {error}" if error else "abort"))


def _transformers_logging() -> dict[str, Any]:
    """This process's transformers verbosity and progress-bar switch, for the child to copy (so a CLI that
    silenced load reports and progress bars gets a silent engine process too)."""
    from transformers.utils import logging as hf_logging

    return {"verbosity": hf_logging.get_verbosity(), "progress_bar": hf_logging.is_progress_bar_enabled()}


def _ended(closed: str) -> Generation:
    if closed == "abort":
        return Generation([], [], [], "abort")
    return Generation([], [], [], "error", error=closed.removeprefix("error: "))
