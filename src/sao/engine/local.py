"""`LocalEngine`: an in-process inference engine for HF causal LMs (CPU or one GPU) with continuous batching.

Threads. The engine owns one loop thread (started by `LocalEngine.start` or the first call, stopped by
`LocalEngine.close`); the model runs only there, so the callers' event loops stay responsive. Callers talk
to it through a lock-guarded inbox; each request carries an asyncio future of the caller's own event loop,
resolved with ``call_soon_threadsafe`` (any event loop, in any thread, may call `generate`).

Steps. Each iteration of the loop, at a step boundary: take new requests and weight updates from the inbox,
apply the updates (the new version takes effect for the next forward), drop cancelled requests, then one
step of the `local_batch.RunningBatch`: admission, **one** forward (the admitted prompts' prefill and one
decode token per running sequence), sampling, and the finished requests' `Generation`.

Log-probs: the recorded log-prob is that of the distribution actually sampled from (temperature, top-k,
top-p, renormalised); at temperature 1 without filters it is the trainer's teacher-forced log-prob with the
same weights (invariant 3 of docs/concepts.md; tested against `sao.models.forward.token_logprobs`).

Weight updates (`update_weights`) are applied between steps and never abort in-flight requests; each token
records the version of the weights whose forward produced its distribution (invariant 4 there). By default the
KV already cached for in-flight sequences is kept (computed by the older weights): the update costs only
the copy of the weights, and a request's tokens after the update come from the new weights reading a prefix
encoded by the old ones. With ``recompute_kv_on_update=True`` every in-flight sequence is re-prefilled with
the new weights in the next step: its later tokens are exactly what the new policy produces from that
prefix, at the cost of one prefill of every in-flight sequence (prompt + generated so far) per update.

Turns of an episode. When a request finishes (stop or length), its KV is kept (`prefix_store`) within
``prefix_cache_tokens`` positions (least recently kept evicted first); a later request whose prompt starts
with that request's tokens (prompt + generated: the next turn of an agentic episode) takes it and prefills
only its new tokens. The kept KV is what the request's own forwards computed, possibly under older weights, so
a turn that follows a weight update reads a prefix encoded by the weights of earlier turns, exactly as an in-
flight request reads KV written before an update; its new tokens record the version that computed them, as
always. With ``recompute_kv_on_update=True`` an update drops every kept entry too.

Stop tokens are not implied: generation ends on ``params.stop_token_ids`` (pass the EOS id there), a stop
string, ``max_new_tokens`` or the context limit ``min(max_model_len, max_kv_tokens)`` on prompt +
generated tokens (``finish_reason="length"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sao.engine.futures import threadsafe_setter
from sao.engine.kv_cache import ENGINE_ATTENTION
from sao.engine.local_batch import RunningBatch
from sao.engine.local_request import Request, StopChecker, check_request
from sao.engine.local_weights import apply_state_dict, prepare_state_dict
from sao.engine.types import FinishReason, Generation, SamplingParams, WeightsLike
from sao.models.loading import load_policy, load_tokenizer, resolve_device, resolve_dtype

__all__ = ["LocalEngine"]

_log = logging.getLogger(__name__)


@dataclass
class _Update:
    state: dict[str, Tensor]
    version: int
    deliver: Callable[[BaseException | None], None]


def _model_and_tokenizer(
    source: str | Path | PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | str | Path | None,
    device: str | torch.device,
    dtype: str | torch.dtype,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """The engine's model (loaded from a checkpoint directory, or a given model moved to ``device`` /
    ``dtype`` unless ``"auto"``) and tokenizer (a directory loaded; by default the checkpoint's own)."""
    if isinstance(source, (str, Path)):
        model = load_policy(source, dtype=dtype, device=device)
        if tokenizer is None and Path(source, "tokenizer_config.json").is_file():
            tokenizer = source
    else:
        model = source
        if device != "auto":
            model.to(resolve_device(device))
        if dtype != "auto":
            model.to(resolve_dtype(dtype, next(model.parameters()).device))
    return model, load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer


class LocalEngine:
    """In-process `InferenceEngine` for an HF causal LM (see the module docstring).

    ``model_path_or_model``: a checkpoint directory (loaded with `load_policy`; its tokenizer too unless
    ``tokenizer`` is given) or a loaded model, which the engine then uses in place (its attention is
    switched to ``sao_engine``, which behaves as ``sao_varlen`` outside engine steps, and restored by
    `close`). ``tokenizer`` (object or directory) is needed only for stop strings. ``device``/``dtype``:
    ``"auto"`` as in `load_policy` (for a model object: keep its own). ``max_running``: concurrent
    sequences; ``max_kv_tokens``: KV tokens reserved by running sequences (also caps the context);
    ``max_model_len``: context limit (default the model's ``max_position_embeddings``); ``seed``: seeds the
    generator of each request that gives no seed of its own (with the request's arrival index);
    ``lean_forward``: run Qwen3 / Qwen3-MoE backbones with `LeanForward` (same math as the HF modules, less
    per-call overhead; other models always use the HF modules). ``prefix_cache_tokens``: KV positions kept
    for later turns of finished requests (None: ``max_kv_tokens``; 0: none kept). ``threads``: intra-op
    torch threads of the loop thread, set when it starts (None: as the process has them; `sao.runtime.threads`
    explains the one BLAS pool a process shares); ``stats()["threads"]`` is the count the loop runs with.
    """

    def __init__(
        self,
        model_path_or_model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | str | Path | None = None,
        *,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        max_running: int = 32,
        max_kv_tokens: int = 65536,
        max_model_len: int | None = None,
        recompute_kv_on_update: bool = False,
        seed: int = 0,
        lean_forward: bool = True,
        prefix_cache_tokens: int | None = None,
        threads: int | None = None,
    ) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1 or None, got {threads}")
        model, tokenizer = _model_and_tokenizer(model_path_or_model, tokenizer, device, dtype)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_input_embeddings().num_embeddings
        model_len = max_model_len or getattr(model.config, "max_position_embeddings", None)
        if model_len is None or model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 (or known from the model config), got {model_len}")
        self.context_limit = min(model_len, max_kv_tokens)
        self.recompute_kv_on_update = recompute_kv_on_update
        self.threads = threads
        self._loop_threads = 0  # the loop thread's intra-op threads, read when it starts
        self.seed = seed
        self._batch = RunningBatch(
            model, self.device, max_running=max_running, max_kv_tokens=max_kv_tokens,
            context_limit=self.context_limit, lean=lean_forward,
            prefix_cache_tokens=max_kv_tokens if prefix_cache_tokens is None else prefix_cache_tokens,
            stop=StopChecker(self.context_limit, self._decode if self.tokenizer is not None else None),
            deliver=self._deliver,
        )  # fmt: skip
        # Last, once every argument is checked: the only change made to a borrowed model (undone by close).
        self._original_attention = model.config._attn_implementation
        model.set_attn_implementation(ENGINE_ATTENTION)
        if model.config._attn_implementation != ENGINE_ATTENTION:
            raise ValueError(f"{type(model).__name__} does not accept a custom attention implementation")
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._inbox: list[Request] = []
        self._updates: list[_Update] = []
        self._cancel_pending = False
        self._thread: threading.Thread | None = None
        self._closing = False
        self._closed_reason: tuple[FinishReason, str | None] | None = None
        self._latest_requested_version = 0
        self._delivered = dict.fromkeys(("finished", "aborted", "errors"), 0)  # under self._cond
        self._started_at: float | None = None
        self._idle_s = 0.0
        self._idle_since: float | None = None
        self._last_update_latency_s = float("nan")

    # ----------------------------------------------------------------------------------------- public API

    @property
    def version(self) -> int:
        """Policy version of the weights that decode steps use now."""
        return self._batch.version

    def start(self) -> None:
        """Start the engine loop thread (idempotent; `generate` and `update_weights` start it too)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("LocalEngine is closed")
            if self._thread is None:
                self._started_at = time.perf_counter()
                self._thread = threading.Thread(target=self._run, name="sao-local-engine", daemon=True)
                self._thread.start()

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Generate one completion of ``prompt_token_ids``; raises `InvalidRequestError` for a request the
        engine cannot serve (the engine keeps serving the others)."""
        prompt = check_request(
            prompt_token_ids, params, self.vocab_size, self.context_limit, self.tokenizer is not None
        )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        request_id = next(self._ids)
        seed = (params.seed if params.seed is not None else self.seed * 1_000_003 + request_id) % 2**64
        request = Request(
            request_id=request_id,
            prompt=prompt,
            params=params,
            kv_reserve=min(len(prompt) + params.max_new_tokens, self.context_limit),
            generator=torch.Generator().manual_seed(seed),
            deliver=threadsafe_setter(loop, future),
        )
        self._submit(request)
        try:
            return await future
        except asyncio.CancelledError:
            with self._cond:
                request.cancelled = True
                self._cancel_pending = True
                self._cond.notify_all()
            raise

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        """Load ``weights`` (state dict in the trainer's or the checkpoint's naming, or a checkpoint
        directory) as ``version``; returns once the next engine step uses them. Versions must not
        decrease. The tensors are read when the update takes effect: do not modify them before this
        returns. Raises ValueError (unknown name, wrong shape, decreasing version) before anything changes."""
        started = time.perf_counter()
        if isinstance(weights, (str, Path)):
            state = await asyncio.to_thread(prepare_state_dict, self.model, weights)
        else:
            state = prepare_state_dict(self.model, weights)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self.start()
        with self._cond:
            if version < self._latest_requested_version:
                raise ValueError(f"version {version} is older than {self._latest_requested_version}")
            if self._closing:
                raise RuntimeError("LocalEngine is closed")
            self._latest_requested_version = version
            self._updates.append(_Update(state, version, threadsafe_setter(loop, future)))
            self._cond.notify_all()
        await future
        self._last_update_latency_s = time.perf_counter() - started

    def stats(self) -> dict[str, float]:
        """``running``, ``waiting``, ``finished`` (all delivered results), ``aborted``, ``errors``,
        ``tokens_generated``, ``prefill_tokens``, ``decode_steps``, ``context_tokens`` (Σ over steps of the
        running sequences' lengths: the attention work), ``idle_fraction`` (loop time with nothing to run /
        time since start; ``idle_s`` and ``uptime_s`` are the two terms, ``busy_s`` their difference),
        ``version``, ``threads`` (the loop thread's intra-op torch threads; 0 before it starts),
        ``last_update_latency_s`` (NaN before the first update), ``kv_tokens_reserved``, ``kv_capacity``
        (positions per slot currently allocated), ``prefix_hits`` (requests that continued a kept KV),
        ``prefix_reused_tokens`` (prompt positions they did not prefill), ``prefix_cached_tokens`` /
        ``prefix_entries`` (kept now), ``prefix_evictions`` / ``prefix_evicted_tokens`` (dropped for room)."""
        with self._cond:
            now = time.perf_counter()
            wall = 0.0 if self._started_at is None else now - self._started_at
            idle = self._idle_s + (0.0 if self._idle_since is None else now - self._idle_since)
            batch = self._batch
            out = {name: float(value) for name, value in (*self._delivered.items(), *batch.counters.items())}
            out.update(
                running=float(len(batch.scheduler.running)),
                waiting=float(len(self._inbox) + len(batch.scheduler.waiting)),
                idle_fraction=idle / wall if wall > 0 else 0.0,
                idle_s=idle,
                uptime_s=wall,
                busy_s=wall - idle,
                version=float(batch.version),
                threads=float(self._loop_threads),
                last_update_latency_s=self._last_update_latency_s,
            )
            out.update(batch.memory_stats())
            return out

    async def close(self) -> None:
        """Stop the loop; pending and running requests finish with ``finish_reason="abort"`` (with what they
        generated so far). Later requests are aborted at once. Idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join)
        self._shutdown("abort", None)
        if self.model.config._attn_implementation == ENGINE_ATTENTION:
            self.model.set_attn_implementation(self._original_attention)

    async def __aenter__(self) -> LocalEngine:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """Teacher-forced log-probs of ``token_ids[1:]`` (temperature 1) under the weights the engine holds
        now: one forward in a worker thread beside the engine loop (`sao.engine.scoring.score_tokens`).
        Raises ValueError for fewer than 2 ids or an id outside the vocabulary. Do not call it while an
        update is being applied (the run scores between pushes)."""
        from sao.engine.scoring import check_score_ids, score_tokens

        ids = check_score_ids(token_ids, self.vocab_size)
        return await asyncio.to_thread(score_tokens, self.model, ids)

    # ---------------------------------------------------------------------------------------- submission

    def _submit(self, request: Request) -> None:
        with self._cond:
            closed = self._closing or self._closed_reason is not None
            if not closed:
                self._inbox.append(request)
                self._cond.notify_all()
        if closed:
            reason, error = self._closed_reason or ("abort", None)
            self._deliver(request, request.result(reason, error))
            return
        # RuntimeError: closed between the two locks; close() aborts whatever is in the inbox.
        with contextlib.suppress(RuntimeError):
            self.start()

    def _decode(self, token_ids: list[int]) -> str:
        assert self.tokenizer is not None
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    # ---------------------------------------------------------------------------------------- engine loop

    def _has_work(self) -> bool:
        return bool(self._inbox or self._updates or self._batch.has_work())

    def _run(self) -> None:
        failure: str | None = None
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        self._loop_threads = torch.get_num_threads()
        try:
            with torch.no_grad():
                while self._loop_once():
                    pass
        except BaseException as err:  # a bug in the loop itself: fail everyone rather than hang them
            failure = f"engine loop crashed: {err!r}"
            _log.exception("LocalEngine loop crashed; every pending and later request fails")
        finally:
            self._shutdown("error" if failure else "abort", failure)

    def _loop_once(self) -> bool:
        with self._cond:
            if not self._has_work() and not self._closing:
                # The slot buffers stay allocated while idle: an episode's next turn arrives soon, and
                # re-allocating (zeroing) them per turn costs time that grows with the context.
                self._idle_since = time.perf_counter()
                while not self._has_work() and not self._closing:
                    self._cond.wait()
                self._idle_s += time.perf_counter() - self._idle_since
                self._idle_since = None
            if self._closing:
                return False
            inbox, self._inbox = self._inbox, []
            updates, self._updates = self._updates, []
            cancels, self._cancel_pending = self._cancel_pending, False
        for request in inbox:
            self._batch.scheduler.add(request)
        self._apply_updates(updates)
        if cancels:
            self._batch.drop_cancelled()
        self._step()
        return True

    def _step(self) -> None:
        """One `RunningBatch.step` (a method of its own so a profiler can wrap it: benchmarks/engine.py)."""
        self._batch.step()

    def _apply_updates(self, updates: list[_Update]) -> None:
        for update in updates:
            try:
                apply_state_dict(self.model, update.state)
            except Exception as err:
                update.deliver(err)
                continue
            self._batch.weights_changed(update.version, self.recompute_kv_on_update)
            update.deliver(None)

    def _deliver(self, request: Request, generation: Generation) -> None:
        with self._cond:
            if request.done:
                return
            request.done = True
            self._delivered["finished"] += 1
            if generation.finish_reason == "abort":
                self._delivered["aborted"] += 1
            elif generation.finish_reason == "error":
                self._delivered["errors"] += 1
        request.deliver(generation)

    def _shutdown(self, reason: FinishReason, error: str | None) -> None:
        """Finish every request still held with ``reason`` and fail pending updates (idempotent)."""
        with self._cond:
            if self._closed_reason is None:
                self._closed_reason = (reason, error)
            inbox, self._inbox = self._inbox, []
            updates, self._updates = self._updates, []
        for request in [*self._batch.drain(), *inbox]:
            self._deliver(request, request.result(reason, error))
        for update in updates:
            update.deliver(RuntimeError(error or "LocalEngine closed before the update took effect"))
