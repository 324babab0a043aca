"""`HTTPEngine`: the client side that the vLLM and SGLang adapters share.

The wire format (SSE parsing, error bodies, `TokenDelta`, `checked_prompt`) lives in
`sao.engine.http_protocol` and the server child process (`ServerProcess`, `free_port`) in
`sao.engine.server_process`.

`HTTPEngine` is the `InferenceEngine` logic that does not depend on the server's API: one streamed HTTP
request per generation, per-token versions, weight updates under a lock, counters and shutdown. A subclass
says how to build the request body, how to read one stream chunk (`TokenDelta`) and how to reload weights
from a directory (`HTTPEngine._reload`, which pauses the server, loads, calls `HTTPEngine._commit_version`
and resumes).

Versions. Each token gets the adapter's version at the moment its chunk is *received*. `_commit_version`
bumps it only while the server is paused after the reload, once every open stream has been quiet for
``settle_s``: a server streams a request's tokens in order, so the tokens computed before the pause arrive
before any token of the new weights, and the attribution is exact unless the server delivers an already
generated token later than the whole update takes. Generations that span an update carry
``metadata["version_attribution"] = "stream_order"`` and ``metadata["updates_spanned"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sao.engine.http_protocol import SSE_DONE, ServerError, TokenDelta, error_message, parse_sse_line
from sao.engine.server_process import ServerProcess
from sao.engine.types import Generation, InvalidRequestError, SamplingParams, WeightsLike
from sao.engine.weights import write_update_dir

__all__ = ["HTTPEngine"]


@dataclass
class _Stream:
    """One in-flight request as the adapter sees it."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    last_chunk_at: float = field(default_factory=time.monotonic)
    server_version: str | None = None
    response: httpx.Response | None = None


class HTTPEngine:
    """`InferenceEngine` over one streaming HTTP model server; subclasses fill in the server's API (see the
    module docstring). Counters: `stats`."""

    engine_name = "http"
    generate_path = "/generate"

    def __init__(
        self,
        base_url: str,
        *,
        version: int = 0,
        server: ServerProcess | None = None,
        update_dir: str | Path | None = None,
        config_dir: str | Path | None = None,
        settle_s: float = 0.05,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._version = version
        self._server = server
        self._config_dir = None if config_dir is None else Path(config_dir)
        self._owns_update_dir = update_dir is None
        self._update_dir = None if update_dir is None else Path(update_dir)
        self._settle_s = settle_s
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(None, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self._streams: dict[str, _Stream] = {}
        self._update_lock = asyncio.Lock()
        self._closing = False
        self._unreachable = False  # a connection was refused (the server is gone)
        self._last_update_dir: Path | None = None
        names = ("requests", "finished", "aborted", "errors", "rejected", "tokens_generated", "updates")
        self._counters = dict.fromkeys(names, 0)
        self._last_update_latency_s = float("nan")
        self._last_pause_s = float("nan")
        self._paused_at: float | None = None

    # ---- what a subclass provides ---------------------------------------------------------------------

    def _request_body(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> dict[str, Any]:
        """The JSON body of a streamed generation (raises `InvalidRequestError` for an invalid request)."""
        raise NotImplementedError

    def _parse_chunk(self, data: Mapping[str, Any], received: int) -> TokenDelta:
        """One decoded stream chunk of a request that has ``received`` tokens so far."""
        raise NotImplementedError

    async def _reload(self, path: Path, version: int) -> None:
        """Load the checkpoint directory ``path`` with generation paused (never aborting requests), calling
        `_commit_version` while paused; resume even on failure."""
        raise NotImplementedError

    @classmethod
    async def attach(cls, base_url: str, **kwargs: Any) -> Any:
        """An adapter for the running server at ``base_url`` (settings read from the server)."""
        raise NotImplementedError

    # ---- launching ----------------------------------------------------------------------------------------

    @classmethod
    async def _start_and_attach(
        cls,
        argv: Sequence[str],
        base_url: str,
        *,
        env: Mapping[str, str],
        timeout_s: float,
        log_path: str | Path | None,
        **kwargs: Any,
    ) -> Any:
        """Start the server ``argv`` (a `ServerProcess`) and `attach` to it, the adapter owning the process;
        the server is stopped again if attaching fails."""
        server = await asyncio.to_thread(
            ServerProcess.start, argv, base_url, env=env, timeout_s=timeout_s, log_path=log_path
        )
        try:
            return await cls.attach(server.base_url, server=server, **kwargs)
        except BaseException:
            await asyncio.to_thread(server.stop)
            raise

    # ---- InferenceEngine --------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def alive(self) -> bool:
        """False once a launched server process has exited, or an attached server refused a connection
        (a run's `SupervisedEngine` then launches or attaches anew)."""
        if self._closing or self._unreachable:
            return False
        return self._server is None or self._server.running

    @property
    def server(self) -> ServerProcess | None:
        """The launched server process (None when attached)."""
        return self._server

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Generation:
        request_id = f"sao-{uuid.uuid4().hex}"
        body = self._request_body(prompt_token_ids, params, request_id)
        prompt_tokens = len(prompt_token_ids)
        if self._closing:
            return Generation([], [], [], "abort", prompt_tokens=prompt_tokens)
        self._counters["requests"] += 1
        stream = _Stream()
        self._streams[request_id] = stream
        last = TokenDelta()
        try:
            async with self._client.stream("POST", self.generate_path, json=body) as response:
                stream.response = response
                if response.status_code == 200:
                    last = await self._read_stream(response, stream)
                else:
                    detail = error_message((await response.aread()).decode(errors="replace"))
                    if response.status_code in (400, 422):
                        raise InvalidRequestError(f"{self.engine_name} rejected the request: {detail}")
                    last = TokenDelta(finish_reason="error", error=f"HTTP {response.status_code}: {detail}")
        except httpx.HTTPError as e:
            self._unreachable = self._unreachable or isinstance(e, httpx.ConnectError)
            last = TokenDelta(
                finish_reason="abort" if self._closing else "error", error=f"{type(e).__name__}: {e}"
            )
        except InvalidRequestError:
            self._counters["rejected"] += 1
            raise
        except RuntimeError:  # httpx refuses to send once `close` has closed the client
            if not self._closing:
                raise
            last = TokenDelta(finish_reason="abort")
        finally:
            del self._streams[request_id]
        if last.finish_reason is None:  # the stream ended without one
            last = TokenDelta(finish_reason="abort" if self._closing else "error", error="stream ended early")
        return self._generation(request_id, stream, last, prompt_tokens)

    async def _read_stream(self, response: httpx.Response, stream: _Stream) -> TokenDelta:
        async for line in response.aiter_lines():
            data = parse_sse_line(line)
            if data is SSE_DONE:
                break
            if data is None:
                continue
            delta = self._parse_chunk(data, len(stream.token_ids))
            if delta.invalid_request and not stream.token_ids:
                raise InvalidRequestError(f"{self.engine_name} rejected the request: {delta.error}")
            version = self._version  # read at receipt: see "Versions" in the module docstring
            stream.token_ids.extend(delta.token_ids)
            stream.logprobs.extend(delta.logprobs)
            stream.versions.extend([version] * len(delta.token_ids))
            stream.last_chunk_at = time.monotonic()
            stream.server_version = delta.server_version or stream.server_version
            if delta.finish_reason is not None:
                return delta
        return TokenDelta()

    def _generation(
        self, request_id: str, stream: _Stream, last: TokenDelta, prompt_tokens: int
    ) -> Generation:
        finish = last.finish_reason or "error"
        self._counters[{"abort": "aborted", "error": "errors"}.get(finish, "finished")] += 1
        self._counters["tokens_generated"] += len(stream.token_ids)
        metadata: dict[str, Any] = {"engine": self.engine_name, "request_id": request_id}
        if last.stop_reason is not None:
            metadata["stop_reason"] = last.stop_reason
        if stream.server_version is not None:
            metadata["server_weight_version"] = stream.server_version
        spanned = len(set(stream.versions)) - 1
        if spanned > 0:
            metadata["version_attribution"] = "stream_order"
            metadata["updates_spanned"] = spanned
        return Generation(
            token_ids=stream.token_ids,
            logprobs=stream.logprobs,
            versions=stream.versions,
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            error=last.error if finish == "error" else None,
            metadata=metadata,
        )

    async def update_weights(self, weights: WeightsLike, version: int) -> None:
        """Load ``weights`` as ``version`` with generation paused; in-flight requests are frozen, never
        aborted. A state dict (trainer names) is written to a new directory under ``update_dir`` (a
        temporary directory by default; the previous one is deleted) with experts unfused; a path is loaded
        as it is and must be readable by the server. Raises RuntimeError if the server refuses (the version
        is then unchanged; generation resumes either way)."""
        async with self._updating():
            path = await asyncio.to_thread(self._weights_path, weights, version)
            try:
                await self._reload(path, version)
            except BaseException:
                if path != self._last_update_dir and self._is_ours(path):
                    shutil.rmtree(path, ignore_errors=True)
                raise
            previous, self._last_update_dir = self._last_update_dir, path
            if previous is not None and previous != path and self._is_ours(previous):
                shutil.rmtree(previous, ignore_errors=True)

    @contextlib.asynccontextmanager
    async def _updating(self) -> AsyncIterator[None]:
        """One weight update (from disk or native): refused once closed, one at a time, its pause time
        (`_mark_paused` … end) and latency recorded, counted in ``updates`` when the body succeeds."""
        if self._closing:
            raise RuntimeError("engine is closed")
        async with self._update_lock:
            started = time.perf_counter()
            try:
                yield
            finally:
                if self._paused_at is not None:
                    self._last_pause_s, self._paused_at = time.perf_counter() - self._paused_at, None
            self._counters["updates"] += 1
            self._last_update_latency_s = time.perf_counter() - started

    def _weights_path(self, weights: WeightsLike, version: int) -> Path:
        if isinstance(weights, str | Path):
            path = Path(weights)
            if not path.is_dir():
                raise FileNotFoundError(f"weights directory {str(path)!r} does not exist")
            return path.resolve()
        if self._update_dir is None:
            self._update_dir = Path(tempfile.mkdtemp(prefix=f"sao-{self.engine_name}-weights-"))
        target = self._update_dir / f"v{version}-{uuid.uuid4().hex[:8]}"
        return write_update_dir(weights, target, config_from=self._config_dir)

    def _is_ours(self, path: Path) -> bool:
        return self._update_dir is not None and self._update_dir in path.parents

    def _mark_paused(self) -> None:
        """Called by `_reload` once the server is paused (for ``last_pause_s``)."""
        self._paused_at = time.perf_counter()

    async def _commit_version(self, version: int) -> None:
        """Make ``version`` the one new tokens get, once every open stream has been quiet for ``settle_s``
        (at most 20 x ``settle_s``). Call only while the server is paused with the new weights loaded."""
        deadline = time.monotonic() + 20 * self._settle_s
        while self._streams and time.monotonic() < deadline:
            quiet_for = time.monotonic() - max(s.last_chunk_at for s in self._streams.values())
            if quiet_for >= self._settle_s:
                break
            await asyncio.sleep(self._settle_s - quiet_for)
        self._version = version

    async def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        """POST to the server; `ServerError` unless it answers 200 (naming the endpoint)."""
        response = await self._client.post(path, timeout=600.0, **kwargs)
        if response.status_code != 200:
            raise ServerError(
                f"{self.engine_name} {path} failed ({response.status_code}): {error_message(response.text)}",
                response.status_code,
            )
        return response

    def stats(self) -> dict[str, float]:
        """``running`` (open requests), ``in_flight_tokens`` (tokens received so far by open requests),
        ``requests``, ``finished``, ``aborted``, ``errors``, ``rejected`` (invalid requests the server
        refused), ``tokens_generated`` (by finished requests), ``updates``, ``version``,
        ``last_update_latency_s`` (write + pause + load + resume) and ``last_pause_s`` (time the server was
        paused; both NaN before the first update)."""
        out = {name: float(value) for name, value in self._counters.items()}
        out.update(
            running=float(len(self._streams)),
            in_flight_tokens=float(sum(len(s.token_ids) for s in self._streams.values())),
            version=float(self._version),
            last_update_latency_s=self._last_update_latency_s,
            last_pause_s=self._last_pause_s,
        )
        return out

    async def close(self) -> None:
        """Disconnect open requests (the server aborts them; they return ``finish_reason="abort"`` with what
        they had), close the client, stop a launched server and delete the adapter's update directory.
        Idempotent."""
        if not self._closing:
            self._closing = True
            for stream in list(self._streams.values()):
                if stream.response is not None:
                    with contextlib.suppress(Exception):
                        await stream.response.aclose()
            deadline = time.monotonic() + 10.0
            while self._streams and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await self._client.aclose()
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)
        if self._owns_update_dir and self._update_dir is not None:
            shutil.rmtree(self._update_dir, ignore_errors=True)
