"""A calculator agent written only against the ``openai`` SDK, for sao's OpenAI-compatible gateway.

The agent plays ``calculator`` tasks ("What is 37 * 12?") over ``/v1/chat/completions`` with one tool,
``calc(expr)``, which it runs itself (a small ``ast`` evaluator: integers, ``+ - *``, unary minus,
parentheses). Each episode is one gateway session (``extra_body={"session_id": ...}``), so sao records it
token-in/token-out as a training trajectory; the agent then closes the session with
``POST /v1/sessions/{id}/reward``:

- ``--reward agent`` (default): the agent scores the episode with the env's rule (1.0 when the final
  answer's last integer equals the true value and an earlier tool result equals it, else 0.0) and posts
  ``{"reward": r}``;
- ``--reward verifier``: it posts ``{"task_id": id}`` and the run's environment scores the session.

Every finished episode is closed, also with 0.0, so no session is left to be dropped as abandoned.
``--group-size G`` plays each task G times at once as one GRPO group (``group_id`` ``"<task id>#<n>"``
in every member's ``extra_body``). Without ``--sessions N`` the agent cycles through the tasks until the
server goes away (a training run that finished): then it prints its summary and exits 0.
``--eval`` plays every task ``--k`` times without a session id (served, not recorded, not trained), prints
Pass@1 (mean reward over all samples) and pass@k, and writes a JSON report (``--out``).

Robustness (`with_retries`): 429/503 (the run is over capacity) are waited out as ``Retry-After`` says; a
5xx or a lost connection is retried ``--max-retries`` times; a 4xx on a session (closed, truncated,
refused) is logged (the first few, then counted) and the agent goes on with the next task; a session the
server closed itself (409 on the reward: truncated by the token budget) counts with reward 0; a refused
or closed connection after that ends the run. Sampling is the server's: no temperature, top_p or
max_tokens is sent.

    python examples/openai_agent/agent.py --tasks calc.jsonl --sessions 200
    python examples/openai_agent/agent.py --tasks calc.jsonl --eval --k 4 --out eval.json
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import itertools
import json
import random
import re
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import openai

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "parameters": {
                "type": "object",
                "properties": {"expr": {"type": "string"}},
                "required": ["expr"],
            },
        },
    }
]
PROGRESS_EVERY = 32
REWARD_WINDOW = 64
LOGGED_PER_KIND = 5  # error lines printed per kind; later ones are only counted
MAX_EXPR_CHARS = 64
BACKOFF_ATTEMPTS = 30  # 429/503 answers waited out per request (the client itself never retries)
_INT = re.compile(r"-?\d+")
T = TypeVar("T")


class ServerGoneError(Exception):
    """The server refused or closed the connection: the run is over."""


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    answer: int


@dataclass
class Episode:
    answer: int
    final: str | None = None  # content of the final answer; None when the turns ran out
    tool_results: list[str] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """The calculator env's rule: right last integer, and the tool produced that value."""
        return score(self.final, self.tool_results, self.answer)


@dataclass
class Stats:
    """Counters of a run; one event loop, so no locking."""

    started_at: float = field(default_factory=time.monotonic)
    done: int = 0
    reward_sum: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=REWARD_WINDOW))
    errors: Counter[str] = field(default_factory=Counter)
    closed_by_server: int = 0  # sessions the gateway had closed (truncated): counted with reward 0
    label: str = "sessions"

    def finish(self, reward: float) -> None:
        self.done += 1
        self.reward_sum += reward
        self.recent.append(reward)
        if self.done % PROGRESS_EVERY == 0:
            print(self.progress_line(), flush=True)

    def error(self, kind: str, message: str) -> None:
        self.errors[kind] += 1
        if self.errors[kind] <= LOGGED_PER_KIND:
            more = " (further ones are only counted)" if self.errors[kind] == LOGGED_PER_KIND else ""
            print(f"[{kind}] {message[:200]}{more}", file=sys.stderr, flush=True)

    def rate(self) -> float:
        return self.done / max(time.monotonic() - self.started_at, 1e-9)

    def progress_line(self) -> str:
        recent = sum(self.recent) / len(self.recent) if self.recent else 0.0
        errors = sum(self.errors.values())
        return (
            f"{self.label} {self.done}  reward(last {len(self.recent)}) {recent:.3f}  errors {errors}  "
            f"closed by server {self.closed_by_server}  {self.rate():.2f} {self.label}/s"
        )

    def summary_line(self, reason: str) -> str:
        mean = self.reward_sum / self.done if self.done else 0.0
        errors = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        elapsed = time.monotonic() - self.started_at
        return (
            f"done ({reason}): {self.done} {self.label}, mean reward {mean:.3f}, errors: {errors}, "
            f"closed by server {self.closed_by_server}, "
            f"{self.rate():.2f} {self.label}/s over {elapsed:.1f} s"
        )


# ---------------------------------------------------------------------------------------------- the tool


class CalcError(ValueError):
    """An expression outside the tool's grammar."""


def evaluate(expr: str) -> int:
    """Integers, ``+ - *``, unary minus and parentheses, parsed with `ast` (never ``eval``)."""
    if len(expr) > MAX_EXPR_CHARS:
        raise CalcError(f"expr longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError) as err:
        raise CalcError(f"cannot parse {expr!r}") from err
    return _eval_node(tree.body)


def _eval_node(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_node(node.operand)
    if isinstance(node, ast.BinOp):
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        raise CalcError(f"unsupported operator {type(node.op).__name__}")
    raise CalcError(f"unsupported {type(node).__name__}")


def run_tool(name: str, arguments: str) -> str:
    """One tool call's result: the value, or ``error: <why>``."""
    if name != "calc":
        return f"error: unknown tool {name[:40]!r}, use 'calc'"
    try:
        args = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return "error: arguments are not valid JSON"
    if not isinstance(args, dict) or not isinstance(args.get("expr"), str):
        return 'error: arguments need a string "expr"'
    try:
        return str(evaluate(args["expr"]))
    except CalcError as err:
        return f"error: {err}"


def score(final: str | None, tool_results: list[str], answer: int) -> float:
    """1.0 when the final answer's last integer is ``answer`` and a tool result was ``str(answer)``."""
    if final is None:
        return 0.0
    found = _INT.findall(final)
    correct = bool(found) and int(found[-1]) == answer
    return 1.0 if correct and str(answer) in tool_results else 0.0


# ------------------------------------------------------------------------------------------- an episode


def assistant_message(message: Any) -> dict[str, Any]:
    """The assistant turn as returned, as a plain dict (role, content, tool_calls)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message.tool_calls
            if call.type == "function"
        ]
    return out


async def play(
    client: openai.AsyncOpenAI,
    model: str,
    task: Task,
    *,
    max_turns: int,
    retries: int,
    extra_body: dict[str, Any],
) -> Episode:
    """Play one episode; SDK errors propagate (the caller classifies them)."""
    episode = Episode(task.answer)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    for _ in range(max_turns):
        completion = await with_retries(
            lambda: client.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, extra_body=extra_body or None
            ),
            retries,
        )
        message = completion.choices[0].message
        turn = assistant_message(message)
        calls = turn.get("tool_calls") or []
        if not calls:
            episode.final = message.content or ""
            return episode
        messages.append(turn)
        for call in calls:
            result = run_tool(call["function"]["name"], call["function"]["arguments"])
            episode.tool_results.append(result)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return episode  # the turns ran out without a final answer


async def with_retries(request: Callable[[], Awaitable[T]], retries: int) -> T:
    """``request()`` with the agent's retry policy (the client itself never retries).

    429 and 503 (the run is over capacity, the engine restarts) are waited out, ``Retry-After`` seconds
    each time, up to `BACKOFF_ATTEMPTS` times; other 5xx, timeouts and connection errors are retried
    ``retries`` times with exponential backoff; a 4xx is raised at once (retrying cannot fix it).
    """
    busy = failures = 0
    while True:
        try:
            return await request()
        except openai.APIStatusError as err:
            if err.status_code in (429, 503) and busy < BACKOFF_ATTEMPTS:
                busy += 1
                await asyncio.sleep(_retry_after(err, busy))
                continue
            if err.status_code < 500 or failures >= retries:
                raise
        except openai.APIConnectionError:
            if failures >= retries:
                raise
        failures += 1
        await asyncio.sleep(_backoff(failures))


def _backoff(attempt: int) -> float:
    return min(0.5 * 2 ** (attempt - 1), 8.0) * (0.75 + 0.25 * random.random())


def _retry_after(err: openai.APIStatusError, attempt: int) -> float:
    try:
        return min(max(float(err.response.headers.get("retry-after", "")), 0.1), 60.0)
    except ValueError:
        return _backoff(attempt)


# ----------------------------------------------------------------------------------------------- sessions


@dataclass
class Runner:
    client: openai.AsyncOpenAI
    model: str
    args: argparse.Namespace
    stats: Stats
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    server_gone: bool = False
    gave_up: bool = False
    pending: int = 0  # sessions in flight
    failed: int = 0  # sessions that closed nothing (not counting the server going away)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    counter: Iterator[int] = field(default_factory=itertools.count)

    def note(self, err: openai.APIError, where: str) -> None:
        """Log and count an SDK error; a refused or closed connection means the server is gone."""
        if isinstance(err, openai.APIConnectionError) and not isinstance(err, openai.APITimeoutError):
            if not self.server_gone:
                print(f"the server went away ({where}: {err}); stopping", file=sys.stderr, flush=True)
            self.server_gone = True
            self.stop.set()
        elif self.server_gone:
            pass  # in-flight sessions failing while the server shuts down are not errors of their own
        elif isinstance(err, openai.APIStatusError):
            self.stats.error(f"http {err.status_code}", f"{where}: {_reason(err)}")
        else:
            self.stats.error(type(err).__name__.removesuffix("Error").lower(), f"{where}: {err}")

    def play(self, task: Task, extra_body: dict[str, Any]) -> Awaitable[Episode]:
        args = self.args
        return play(
            self.client,
            self.model,
            task,
            max_turns=args.max_turns,
            retries=args.max_retries,
            extra_body=extra_body,
        )

    async def session(self, task: Task, group_id: str | None) -> None:
        """One recorded episode, then its reward (also after an error, so the session is closed)."""
        sid = f"{self.tag}-{task.id}-{next(self.counter)}"
        extra: dict[str, Any] = {"session_id": sid, "task_id": task.id}  # task_id: the prompt id, verifier
        if group_id is not None:
            extra["group_id"] = group_id
        reward, chat_failed = 0.0, False
        try:
            reward = (await self.play(task, extra)).reward
        except openai.APIError as err:  # e.g. 409/400: the session was closed (truncated) or refused
            self.note(err, f"session {sid}")
            chat_failed = True
        if self.server_gone:
            return
        counted = await self.close(sid, task, reward, quiet=chat_failed)
        if counted is None:
            self.failed += 0 if self.server_gone else 1
            return
        self.stats.finish(counted)
        if self.args.sessions is not None and self.stats.done >= self.args.sessions:
            self.stop.set()

    async def close(self, sid: str, task: Task, reward: float, *, quiet: bool) -> float | None:
        """Post the reward. The reward that counts: the gateway's (the verifier's score), 0.0 for a session
        the server had closed itself (truncated: trained with reward 0), None when nothing was closed
        (``quiet``: the session's error was already logged)."""
        body: dict[str, Any] = {"task_id": task.id} if self.args.reward == "verifier" else {"reward": reward}
        try:
            reply = await with_retries(
                lambda: self.client.post(f"/sessions/{sid}/reward", body=body, cast_to=object),
                self.args.max_retries,
            )
        except openai.APIStatusError as err:
            if err.status_code == 409:  # "already closed: truncated by the token budget"
                self.stats.closed_by_server += 1
                return 0.0
            if not quiet:
                self.note(err, f"reward {sid}")
            return None
        except openai.APIError as err:
            self.note(err, f"reward {sid}")
            return None
        return _reward_in_reply(reply, reward)

    async def group(self, task: Task, group_id: str | None) -> None:
        size = self.args.group_size
        await asyncio.gather(*(self.session(task, group_id) for _ in range(size)))

    def wanted(self) -> bool:
        """Whether to start another group: not stopped and, with ``--sessions N``, short of N."""
        target = self.args.sessions
        if self.stop.is_set() or target is None:
            return not self.stop.is_set()
        if self.failed >= 2 * target + 64:
            self.gave_up = True
            return False
        return self.stats.done + self.pending < target

    async def worker(self, groups: Iterator[tuple[Task, str | None]]) -> None:
        size = self.args.group_size
        while self.wanted():
            task, group_id = next(groups)
            self.pending += size
            try:
                await self.group(task, group_id)
            finally:
                self.pending -= size


def task_stream(tasks: list[Task], seed: int, group_size: int) -> Iterator[tuple[Task, str | None]]:
    """Tasks forever, reshuffled each pass; with groups, each task's n-th group is ``"<id>#<n>"``."""
    rng = random.Random(seed)
    played: Counter[str] = Counter()
    while True:
        order = list(tasks)
        rng.shuffle(order)
        for task in order:
            group_id = f"{task.id}#{played[task.id]}" if group_size > 1 else None
            played[task.id] += 1
            yield task, group_id


async def train(runner: Runner, tasks: list[Task]) -> int:
    args = runner.args
    groups = task_stream(tasks, args.seed, args.group_size)
    workers = max(1, args.concurrency // args.group_size)  # a group is played whole
    while runner.wanted():  # a round ends short of --sessions when its last sessions failed
        await asyncio.gather(*(runner.worker(groups) for _ in range(workers)))
    if runner.server_gone:
        print(runner.stats.summary_line("the server went away: the run finished"), flush=True)
        return 0 if runner.stats.done else 1
    if runner.gave_up:
        print(runner.stats.summary_line(f"gave up after {runner.failed} failed sessions"), flush=True)
        return 1
    print(runner.stats.summary_line(f"{runner.stats.done} sessions"), flush=True)
    return 0


# ------------------------------------------------------------------------------------------------- eval


async def evaluate_tasks(runner: Runner, tasks: list[Task]) -> int:
    """Every task k times, unrecorded; Pass@1 and pass@k, and a JSON report."""
    args, stats = runner.args, runner.stats
    rewards: dict[str, list[float]] = {task.id: [] for task in tasks}
    queue = iter([task for task in tasks for _ in range(args.k)])

    async def sample(task: Task) -> None:
        try:
            reward = (await runner.play(task, {})).reward
        except openai.APIError as err:
            runner.note(err, f"eval {task.id}")
            reward = 0.0  # a failed sample counts as a miss (see "errors" in the report)
        if not runner.server_gone:
            rewards[task.id].append(reward)
            stats.finish(reward)

    async def worker() -> None:
        for task in queue:
            if runner.stop.is_set():
                return
            await sample(task)

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    if runner.server_gone:
        print(stats.summary_line("the server went away: eval incomplete, no report"), flush=True)
        return 1
    report = eval_report(rewards, args.k, stats)
    print(stats.summary_line("eval"), flush=True)
    print(f"Pass@1 {report['pass@1']:.4f}  pass@{args.k} {report['pass@k']:.4f}  ({len(tasks)} tasks)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


def eval_report(rewards: dict[str, list[float]], k: int, stats: Stats) -> dict[str, Any]:
    samples = [r for rs in rewards.values() for r in rs]
    per_task = {
        tid: {"rewards": rs, "mean": sum(rs) / len(rs) if rs else 0.0, "passed": any(r > 0 for r in rs)}
        for tid, rs in rewards.items()
    }
    return {
        "pass@1": sum(samples) / len(samples) if samples else 0.0,
        "pass@k": sum(t["passed"] for t in per_task.values()) / len(per_task) if per_task else 0.0,
        "k": k,
        "tasks": len(rewards),
        "samples": len(samples),
        "errors": dict(stats.errors),
        "per_task": per_task,
    }


# ------------------------------------------------------------------------------------------------- main


def load_tasks(path: Path) -> list[Task]:
    """JSONL rows ``{"id", "prompt", "answer", ...}``; raises ValueError on a bad file."""
    tasks = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            tasks.append(Task(id=str(row["id"]), prompt=str(row["prompt"]), answer=int(row["answer"])))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}:{number}: not a task row ({err})") from None
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks


async def wait_for_model(client: openai.AsyncOpenAI, wait_s: float) -> str:
    """Poll ``models.list()`` until the server answers; the first model's id."""
    probe = client.with_options(timeout=5.0)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            page = await probe.models.list()
            if page.data:
                return page.data[0].id
        except openai.APIError as err:
            if time.monotonic() >= deadline:
                raise ServerGoneError(f"no server at {client.base_url} after {wait_s:g} s: {err}") from None
        if time.monotonic() >= deadline:
            raise ServerGoneError(f"the server at {client.base_url} lists no model")
        await asyncio.sleep(1.0)


async def run(args: argparse.Namespace, tasks: list[Task], stats: Stats) -> int:
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="sao", max_retries=0)  # see with_retries
    try:
        model = await wait_for_model(client, args.wait_for_server)
        print(f"model {model!r} at {args.base_url}; {len(tasks)} tasks", flush=True)
        runner = Runner(client, model, args, stats)
        stats.started_at = time.monotonic()
        return await (evaluate_tasks(runner, tasks) if args.eval else train(runner, tasks))
    finally:
        await client.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--tasks", type=Path, required=True, help="JSONL rows {id, prompt, answer}")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight at once")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=None, help="stop after N (default: until the end)")
    parser.add_argument("--reward", choices=("agent", "verifier"), default="agent")
    parser.add_argument("--group-size", type=int, default=1, help="G > 1: each task G times, one group")
    parser.add_argument("--seed", type=int, default=0, help="task order")
    parser.add_argument("--wait-for-server", type=float, default=120.0, metavar="SECONDS")
    parser.add_argument("--max-retries", type=int, default=3, help="retries of a 5xx or lost connection")
    parser.add_argument("--eval", action="store_true", help="unrecorded: every task k times, pass@k")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="--eval: the JSON report")
    args = parser.parse_args(argv)
    for name in ("concurrency", "max_turns", "group_size", "k"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.sessions is not None and args.sessions < 1:
        parser.error("--sessions must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        tasks = load_tasks(args.tasks)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stats = Stats(label="samples" if args.eval else "sessions")
    try:
        return asyncio.run(run(args, tasks, stats))
    except ServerGoneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(stats.summary_line("interrupted"), flush=True)
        return 130


def _reward_in_reply(reply: object, default: float) -> float:
    """The reward the gateway attached (``trajectories[0].rewards``, summed: the verifier's score), or
    ``default`` when the reply has none."""
    try:
        rewards = reply["trajectories"][0]["rewards"]  # type: ignore[index]
        return float(sum(rewards))
    except (KeyError, IndexError, TypeError, ValueError):
        return default


def _reason(err: openai.APIStatusError) -> str:
    """``<status> <the server's message>``."""
    body = err.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    message = body.get("message") if isinstance(body, dict) else None
    return f"{err.status_code} {message or err.message}"


if __name__ == "__main__":
    sys.exit(main())
