"""Asking an LLM judge for a score: any OpenAI-compatible endpoint (``POST {base}/v1/chat/completions``).

`JudgeSettings` say where the judge is and what to ask: a system prompt and a user-prompt template
(``str.format`` fields `TEMPLATE_FIELDS` of an episode's `JudgeFields`, rendered by `render_messages`, which
judge training data uses too), the scale asked for (normalised to [0, 1]), the request budget.
`JudgeClient.grade` asks and parses the answer (`parse_score`). Transport errors, timeouts and HTTP
429/5xx are retried with exponential backoff and jitter; other 4xx, malformed bodies and unparseable
answers (temperature 0: same prompt, same answer) are not. A failure raises `JudgeRequestError`, a
`sao.envs.base.JudgeError` (the agent loop drops the episode as ``judge_error``), never a made-up score.
``concurrency`` bounds the requests in flight across every event loop and thread using the client (one
``httpx.AsyncClient`` per loop, opened on first use); parsed answers are cached by content (LRU).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import re
import string
import threading
import time
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import httpx

from .base import JudgeError, Message
from .judges import parse_score, strip_think

__all__ = [
    "DEFAULT_PROMPT",
    "DEFAULT_SYSTEM_PROMPT",
    "FAILURE_KINDS",
    "TEMPLATE_FIELDS",
    "Grade",
    "JudgeClient",
    "JudgeFields",
    "JudgeRequestError",
    "JudgeSettings",
    "parse_score",
    "render_messages",
    "strip_think",
]

# first user message, "role: text" transcript, final assistant text, the task's reference answer, the env's
# own reward, the env's last-step info mapping ({info[style]}), the scale
TEMPLATE_FIELDS = ("prompt", "conversation", "response", "answer", "reward", "info", "score_min", "score_max")
FAILURE_KINDS = ("transport", "http", "timeout", "parse")
DEFAULT_SYSTEM_PROMPT = "You are a strict, fair grader. End your reply with one line: Score: <number>."
DEFAULT_PROMPT = (
    "Grade how well the assistant solved the user's task, from {score_min} (wrong or useless) to "
    "{score_max} (fully correct).\nReference answer (may be empty): {answer}\n\nConversation:\n{conversation}"
)


def _template_fields(template: str) -> set[str]:
    """The root names of the fields ``template`` uses; ValueError for bad syntax or a field not in
    `TEMPLATE_FIELDS` (a positional one included)."""
    roots: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"judge setting prompt is not a valid format string: {err}") from None
    for _, name, spec, _ in parsed:
        if name is None:
            continue
        root = re.match(r"[^.\[]*", name).group()  # type: ignore[union-attr]
        if root not in TEMPLATE_FIELDS:
            known = ", ".join(TEMPLATE_FIELDS)
            raise ValueError(f"judge setting prompt has an unknown field {{{root}}}; known: {known}")
        roots |= {root, *_template_fields(spec or "")}
    return roots


@dataclass(frozen=True)
class JudgeSettings:
    """Where the judge is and what to ask it (see the module docstring).

    ``base_url``: with or without ``/v1``; ``api_key_env``: the environment variable holding the API key
    (a bearer token; None: no auth header); ``prompt``: the user-message template (literal braces doubled);
    ``system_prompt``: sent as is (None/empty: none); ``score_min``/``score_max``: the scale the prompt
    asks for; ``timeout_s``: per attempt; ``retries``: extra attempts after a retryable failure, the k-th
    after ``min(backoff_max_s, backoff_s × 2^(k-1))`` s times a jitter in [0.5, 1]; ``concurrency``:
    requests in flight per client; ``cache_size``: parsed answers kept (0: no cache).
    """

    base_url: str
    model: str
    prompt: str = DEFAULT_PROMPT
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    api_key_env: str | None = None
    score_min: float = 0.0
    score_max: float = 10.0
    temperature: float = 0.0
    max_tokens: int = 1024
    timeout_s: float = 60.0
    retries: int = 3
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    concurrency: int = 16
    cache_size: int = 4096

    def __post_init__(self) -> None:
        t, lo, hi, key = self.timeout_s, self.score_min, self.score_max, self.api_key_env
        back, back_max = self.backoff_s, self.backoff_max_s
        rules = [
            ("base_url", isinstance(self.base_url, str) and re.match(r"https?://\w", self.base_url), "a URL"),
            ("model", isinstance(self.model, str) and self.model != "", "a non-empty string"),
            ("prompt", isinstance(self.prompt, str), "a string"),
            ("system_prompt", self.system_prompt is None or isinstance(self.system_prompt, str), "a string"),
            ("api_key_env", key is None or (isinstance(key, str) and key != ""), "a variable name or None"),
            ("score_min", _finite(lo), "a finite number"),
            ("score_max", _finite(lo) and _finite(hi) and hi > lo, "a finite number above score_min"),
            ("temperature", _finite(self.temperature) and self.temperature >= 0, "a finite number >= 0"),
            ("timeout_s", _finite(t) and t > 0, "a finite number > 0"),
            ("backoff_s", _finite(back) and back >= 0, "a finite number >= 0"),
            ("backoff_max_s", _finite(back_max) and back_max >= back, "a number >= backoff_s"),
        ]
        for name, least in (("max_tokens", 1), ("retries", 0), ("concurrency", 1), ("cache_size", 0)):
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= least
            rules.append((name, ok, f"an integer >= {least}"))
        for name, ok, want in rules:
            if not ok:
                raise ValueError(f"judge setting {name} must be {want}, got {getattr(self, name)!r}")
        if not _template_fields(self.prompt) & {"response", "conversation"}:
            raise ValueError("judge setting prompt must show the episode: use {response} or {conversation}")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1, 2, ...), before the jitter (× 0.5–1)."""
        return min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))

    @property
    def chat_url(self) -> str:
        base = self.base_url.rstrip("/")
        return (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"


@dataclass(frozen=True)
class JudgeFields:
    """The template fields of one finished episode (see `TEMPLATE_FIELDS`; `sao.envs.judged.episode_fields`
    builds them from chat messages). ``answer``/``reward`` None render as empty text."""

    prompt: str
    conversation: str
    response: str
    answer: Any = None
    reward: float | None = None
    info: Mapping[str, Any] = field(default_factory=dict)


def render_messages(settings: JudgeSettings, fields: JudgeFields) -> list[Message]:
    """The chat messages `JudgeClient.grade` sends for ``fields``: the system prompt (when set) and the
    filled template. A field the template cannot fill (a missing ``info`` key, a format spec that does
    not fit the value) raises ValueError."""
    values = vars(fields) | {
        "answer": "" if fields.answer is None else fields.answer,
        "reward": "" if fields.reward is None else fields.reward,
        "score_min": f"{settings.score_min:g}",
        "score_max": f"{settings.score_max:g}",
    }
    try:
        user = settings.prompt.format(**values)
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as err:
        raise ValueError(f"the judge prompt template cannot be filled: {type(err).__name__}: {err}") from err
    system = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []
    return [*system, {"role": "user", "content": user}]


@dataclass(frozen=True)
class Grade:
    """A judge's grade: ``score`` in [0, 1]; ``raw_text`` the answer; ``latency_s`` wall time of the grade,
    retries included (0 from the cache); ``attempts`` HTTP requests it took (0 from the cache)."""

    score: float
    raw_text: str
    latency_s: float
    cached: bool
    attempts: int


class JudgeRequestError(JudgeError):
    """A grade that failed; ``kind`` is one of `FAILURE_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Slots:
    """A counting semaphore shared by every event loop and thread (an ``asyncio.Semaphore`` belongs to one
    loop): a released slot goes to the oldest waiter, woken on its own loop."""

    def __init__(self, n: int) -> None:
        self._free, self._lock = n, threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            waiter = (loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter[1]
        except asyncio.CancelledError:
            with self._lock:
                granted = waiter not in self._waiters
                if not granted:
                    self._waiters.remove(waiter)
            if granted:  # the slot was handed over as the wait was cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(lambda f=future: f.done() or f.set_result(None))
                    return
                except RuntimeError:  # that waiter's loop is closed
                    continue
            self._free += 1


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _retry_after(response: httpx.Response) -> float | None:
    """The seconds of a numeric ``Retry-After`` header (None without one)."""
    value = response.headers.get("retry-after", "").strip()
    return float(value) if re.fullmatch(r"\d+(\.\d+)?", value) else None


class JudgeClient:
    """Grades through the judge of ``settings`` (see the module docstring). ``transport``: an httpx
    transport (tests, custom routing; default the network); ``sleep``/``rng``: the backoff's wait and
    jitter (tests). Raises ValueError when ``settings.api_key_env`` names an unset variable."""

    def __init__(
        self,
        settings: JudgeSettings,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if not isinstance(settings, JudgeSettings):
            raise TypeError(f"JudgeClient needs JudgeSettings, got {type(settings).__name__}")
        self.settings, self._transport = settings, transport
        self._sleep, self._rng = sleep, rng or random.Random()
        self._headers = {}
        if settings.api_key_env is not None:
            if not (key := os.environ.get(settings.api_key_env)):
                raise ValueError(f"the judge's api_key_env variable {settings.api_key_env!r} is not set")
            self._headers["Authorization"] = f"Bearer {key}"
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[Any, httpx.AsyncClient] = weakref.WeakKeyDictionary()
        self._slots = _Slots(settings.concurrency)
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._counts: Counter[str] = Counter()
        self._latency_sum, self._latency_max = 0.0, 0.0

    async def grade(self, fields: JudgeFields) -> Grade:
        """Grade one episode: `render_messages`, then `grade_messages`."""
        return await self.grade_messages(render_messages(self.settings, fields))

    async def grade_messages(
        self, messages: list[Message], parse: Callable[[str], float | None] | None = None
    ) -> Grade:
        """Send ``messages``; ``parse`` reads the answer (text → a value on the settings' scale, or None;
        default `parse_score`). Raises `JudgeRequestError` when no score comes back."""
        s = self.settings
        parse = parse or (lambda text: parse_score(text, s.score_min, s.score_max))
        key = hashlib.sha256(json.dumps([s.model, messages], sort_keys=True).encode()).hexdigest()
        self._add("grades")
        with self._lock:
            if (cached := self._cache.get(key)) is not None:
                self._cache.move_to_end(key)
        if cached is not None and (value := self._in_scale(parse(cached))) is not None:
            self._add("cache_hits")
            return Grade(self._normalise(value), cached, 0.0, True, 0)
        start = time.perf_counter()
        text, attempts = await self._complete(messages)
        if (value := self._in_scale(parse(text))) is None:
            self._fail("parse", f"unparseable answer {text[:300]!r}", attempts)
        latency = time.perf_counter() - start
        with self._lock:
            self._latency_sum += latency
            self._latency_max = max(self._latency_max, latency)
            self._counts["graded"] += 1
            if s.cache_size:
                self._cache[key] = text
                while len(self._cache) > s.cache_size:
                    self._cache.popitem(last=False)
        return Grade(self._normalise(value), text, latency, False, attempts)

    def stats(self) -> dict[str, float]:
        """Cumulative counters: ``grades`` (calls), ``requests`` (HTTP attempts), ``retries``,
        ``cache_hits``, ``failures`` and ``failures/<kind>`` (grades that raised), ``latency_mean_s``/
        ``latency_max_s`` of successful uncached grades (retries included)."""
        with self._lock:
            c = Counter(self._counts)
            mean, peak = self._latency_sum / max(c["graded"], 1), self._latency_max
        out = {k: float(c[k]) for k in ("grades", "requests", "retries", "cache_hits")}
        out |= {f"failures/{k}": float(c[f"failures/{k}"]) for k in FAILURE_KINDS}
        failures = sum(out[f"failures/{k}"] for k in FAILURE_KINDS)
        return out | {"failures": failures, "latency_mean_s": mean, "latency_max_s": peak}

    async def aclose(self) -> None:
        """Close the current event loop's HTTP client (a later grade opens a new one)."""
        with self._lock:
            client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def _add(self, *names: str) -> None:
        with self._lock:
            self._counts.update(names)

    def _fail(self, kind: str, detail: str, attempts: int) -> NoReturn:
        self._add(f"failures/{kind}")
        raise JudgeRequestError(kind, f"judge {kind} failure after {attempts} attempt(s): {detail}")

    def _in_scale(self, value: Any) -> float | None:
        lo, hi = self.settings.score_min, self.settings.score_max
        return float(value) if _finite(value) and lo <= value <= hi else None

    def _normalise(self, value: float) -> float:
        s = self.settings
        return min(1.0, max(0.0, (value - s.score_min) / (s.score_max - s.score_min)))

    def _http(self) -> httpx.AsyncClient:
        """This event loop's HTTP client (clients of closed loops are dropped)."""
        loop, n = asyncio.get_running_loop(), self.settings.concurrency
        with self._lock:
            for closed in [other for other in self._clients if other.is_closed()]:
                del self._clients[closed]
            if (client := self._clients.get(loop)) is None:
                limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
                client = self._clients[loop] = httpx.AsyncClient(
                    transport=self._transport, headers=self._headers, timeout=None, limits=limits
                )
        return client

    async def _complete(self, messages: list[Message]) -> tuple[str, int]:
        """The answer's text and the attempts it took, retrying what the module docstring says."""
        s = self.settings
        body = dict(model=s.model, messages=messages, temperature=s.temperature, max_tokens=s.max_tokens)
        for attempt in range(1, s.retries + 2):
            self._add("requests", *(["retries"] if attempt > 1 else []))
            retry_after = None
            try:
                await self._slots.acquire()
                try:
                    async with asyncio.timeout(s.timeout_s):
                        response = await self._http().post(s.chat_url, json=body)
                finally:
                    self._slots.release()
            except (TimeoutError, httpx.TimeoutException):
                kind, detail = "timeout", f"no answer within {s.timeout_s:g} s"
            except httpx.HTTPError as err:
                kind, detail = "transport", f"{type(err).__name__}: {err}"[:300]
            else:
                if response.is_success:
                    return self._answer_text(response, attempt), attempt
                kind, detail = "http", f"HTTP {response.status_code}: {response.text[:200]!r}"
                if response.status_code != 429 and response.status_code < 500:
                    break
                retry_after = _retry_after(response)
            if attempt > s.retries:
                break
            delay = s.backoff(attempt) * (0.5 + 0.5 * self._rng.random())
            if retry_after is not None:
                delay = max(delay, min(retry_after, s.backoff_max_s))
            await self._sleep(delay)
        self._fail(kind, detail, attempt)

    def _answer_text(self, response: httpx.Response, attempt: int) -> str:
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, LookupError, TypeError):
            self._fail("http", f"malformed response body {response.text[:200]!r}", attempt)
        if content is not None and not isinstance(content, str):
            self._fail("http", f"the answer's content is {type(content).__name__}, not text", attempt)
        return content or ""
