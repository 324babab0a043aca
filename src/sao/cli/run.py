"""`sao serve`, `sao eval`, `sao plot`, `sao train`: run, evaluate and inspect policies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from sao.cli.common import ConfigArgs, _config_from_args, _fail, _quiet_transformers, _stdout, app
from sao.serve.limits import GatewayLimits

if TYPE_CHECKING:
    from sao.eval import EvalSettings


@app.command("serve")
def serve_command(
    model: Annotated[str, typer.Option("--model", help="Checkpoint directory to serve.")],
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    out: Annotated[
        str | None, typer.Option("--out", help="Append finished sessions (trajectories) to this JSONL file.")
    ] = None,
    max_running: Annotated[int, typer.Option(help="Sequences decoded at once.")] = 32,
    max_tokens: Annotated[int, typer.Option(help="Default max_tokens of a request.")] = 1024,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")] = "auto",
    backend: Annotated[str, typer.Option(help="Engine: local (in-process), vllm or sglang.")] = "local",
    attach: Annotated[
        str | None, typer.Option(help="vllm/sglang: URL of a running server instead of launching one.")
    ] = None,
    engine_python: Annotated[
        str | None, typer.Option(help="vllm/sglang: python of the virtualenv that has the engine.")
    ] = None,
    max_sessions: Annotated[
        int, typer.Option(min=1, help="Open sessions at most; a new one beyond gets 429 with Retry-After.")
    ] = GatewayLimits.max_sessions,
    session_idle_timeout: Annotated[
        float,
        typer.Option(
            min=0.001, help="Seconds without a request before an unrewarded session is dropped (abandoned)."
        ),
    ] = GatewayLimits.session_idle_timeout_s,
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="Request body limit in bytes; larger bodies get 413.")
    ] = GatewayLimits.max_body_bytes,
    max_pending: Annotated[
        int,
        typer.Option(min=1, help="Generation requests in flight at once; the next gets 503 + Retry-After."),
    ] = GatewayLimits.max_pending,
    retry_after: Annotated[
        int, typer.Option(min=0, help="Retry-After seconds sent with 429 and 503.")
    ] = GatewayLimits.retry_after_s,
    max_context_tokens: Annotated[
        int | None,
        typer.Option(min=2, help="Prompt + generated tokens of a request (default: the engine's limit)."),
    ] = None,
    tool_call_format: Annotated[str, typer.Option(help="Tool calls: hermes, qwen3_coder.")] = "hermes",
    reasoning_parser: Annotated[str, typer.Option(help="think: <think> block as reasoning; none.")] = "think",
) -> None:
    """OpenAI-compatible gateway: chat/completions and completions with token ids and log-probs; each
    session (X-Session-Id header or session_id field) is recorded token-in/token-out as a trajectory and
    closed by POST /v1/sessions/{id}/reward. Bounded: open sessions, idle time, body size, requests in
    flight, context (see the options)."""
    import uvicorn

    _quiet_transformers()
    parsing = _reply_parsing(tool_call_format, reasoning_parser)
    engine, tokenizer = _serving_engine(model, backend, device, dtype, max_running, attach, engine_python)
    limits = GatewayLimits(
        max_sessions, session_idle_timeout, max_body_bytes, max_pending, retry_after, max_context_tokens
    )
    app_ = _gateway_app(engine, tokenizer, model, max_tokens, out, limits, parsing)
    typer.echo(f"sao gateway for {model} on http://{host}:{port}/v1 (trajectories -> {out or 'memory only'})")
    uvicorn.run(app_, host=host, port=port, log_level="warning")


def _reply_parsing(tool_call_format: str, reasoning_parser: str) -> dict[str, str]:
    """The gateway's reply parsing options, checked; exits 2 naming the allowed values otherwise."""
    from sao.envs.tool_formats import get_tool_format
    from sao.serve.reasoning import get_reasoning_parser

    try:
        get_tool_format(tool_call_format)
        get_reasoning_parser(reasoning_parser)
    except ValueError as err:
        raise _fail(f"error: {err}") from None
    return {"tool_call_format": tool_call_format, "reasoning_parser": reasoning_parser}


def _serving_engine(
    model: str,
    backend: str,
    device: str,
    dtype: str,
    max_running: int,
    attach: str | None,
    engine_python: str | None,
) -> tuple[Any, Any]:
    """``(engine, tokenizer)`` of `sao serve`; exits 2 on an unknown backend, 1 when loading fails."""
    from sao.engine.local import LocalEngine
    from sao.models.loading import load_tokenizer

    if backend not in ("local", "vllm", "sglang"):
        raise _fail(f"error: --backend: must be local, vllm or sglang, got {backend!r}")
    try:
        tokenizer = load_tokenizer(model)
        if backend == "local":
            engine = LocalEngine(model, device=device, dtype=dtype, max_running=max_running)
        else:
            engine = asyncio.run(_remote_engine(backend, model, attach, engine_python))
    except (OSError, ValueError, RuntimeError, TimeoutError) as err:
        raise _fail(f"error: {err}", code=1) from None
    return engine, tokenizer


def _gateway_app(
    engine: Any,
    tokenizer: Any,
    model: str,
    max_tokens: int,
    out: str | None,
    limits: GatewayLimits,
    parsing: dict[str, str],
) -> Any:
    """The gateway app of `sao serve`: it owns ``engine`` and closes it on shutdown."""
    from sao.serve.gateway import create_app

    return create_app(
        engine,
        tokenizer,
        model_name=Path(model).name,
        default_max_tokens=max_tokens,
        output_path=out,
        own_engine=True,
        max_sessions=limits.max_sessions,
        session_idle_timeout_s=limits.session_idle_timeout_s,
        max_body_bytes=limits.max_body_bytes,
        max_pending=limits.max_pending,
        retry_after_s=limits.retry_after_s,
        max_context_tokens=limits.max_context_tokens,
        tool_call_format=parsing["tool_call_format"],
        reasoning_parser=parsing["reasoning_parser"],
    )


async def _remote_engine(backend: str, model: str, attach: str | None, python: str | None) -> Any:
    """A vLLM or SGLang adapter: attached to ``attach`` or launched on ``model`` with ``python``."""
    from sao.engine import SGLangEngine, VLLMEngine

    cls = VLLMEngine if backend == "vllm" else SGLangEngine
    return await (cls.attach(attach) if attach else cls.launch(model, python=python))


@app.command("eval")
def eval_command(
    model: Annotated[str, typer.Option("--model", help="Checkpoint directory to evaluate.")],
    tasks: Annotated[
        list[str],
        typer.Option("--tasks", help="Task file (JSONL); repeat the option or separate files by commas."),
    ],
    env: Annotated[
        str | None, typer.Option(help="Environment for every task (default: each row's env, else math_tir).")
    ] = None,
    env_kwargs: Annotated[
        str | None,
        typer.Option(
            "--env-kwargs",
            help="JSON object of keyword arguments of the env constructor, as data.env_kwargs of a run "
            '(e.g. \'{"datasets": ["chain_sum"]}\').',
        ),
    ] = None,
    k: Annotated[int, typer.Option("--k", help="Samples per problem (Pass@1 is averaged over them).")] = 4,
    seed: Annotated[int, typer.Option(help="Run seed (each sample's seed derives from it).")] = 0,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.")] = 1.0,
    max_turns: Annotated[
        int | None, typer.Option(help="Turn limit (default: the env's own, math 50, coding 300).")
    ] = None,
    max_tokens_per_turn: Annotated[int, typer.Option(help="Tokens one assistant turn may generate.")] = 1024,
    max_total_tokens: Annotated[int, typer.Option(help="Token budget of one episode.")] = 16384,
    concurrency: Annotated[int, typer.Option(help="Episodes run at once.")] = 32,
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N tasks of each file.")] = None,
    out: Annotated[str | None, typer.Option("--out", help="Write the full report (JSON) here.")] = None,
    transcripts: Annotated[
        bool,
        typer.Option(
            help="Keep every sample's episode (text and tokens) in the --out report (`sao inspect`)."
        ),
    ] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")] = "auto",
) -> None:
    """Evaluate a checkpoint: every task k times through the agent loop; Pass@1 (mean over the k samples)
    and pass@k per task file and overall."""
    from sao.eval import run_eval, write_report

    _quiet_transformers()
    paths = _task_files(tasks)
    settings = _eval_settings(
        k=k, seed=seed, temperature=temperature, top_p=top_p, max_turns=max_turns,
        max_tokens_per_turn=max_tokens_per_turn, max_total_tokens=max_total_tokens, concurrency=concurrency,
        env=env, env_kwargs=_json_object(env_kwargs, "--env-kwargs"), limit=limit, transcripts=transcripts,
    )  # fmt: skip
    try:
        report = run_eval(model, paths, settings, device=device, dtype=dtype)
    except (OSError, ValueError) as err:  # EnvError is a ValueError
        raise _fail(f"error: {err}", code=1) from None
    title = f"{Path(model).name}: k={k}, temperature {temperature}, top-p {top_p}, seed {seed}"
    _stdout().print(_eval_table(report, title, k))
    if out:
        typer.echo(f"wrote {write_report(report, out)}")


def _json_object(text: str | None, option: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object ({} when None); exits 2 naming ``option`` otherwise."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise _fail(f"error: {option}: not JSON: {err}") from None
    if not isinstance(value, dict):
        raise _fail(f"error: {option}: expected a JSON object, got {type(value).__name__}")
    return value


def _task_files(tasks: list[str]) -> list[str]:
    """The ``--tasks`` values as file paths (commas split a value); exits 2 naming one that is not a file."""
    paths = [p.strip() for value in tasks for p in value.split(",") if p.strip()]
    for path in paths:
        if not Path(path).is_file():
            raise _fail(f"error: --tasks: {path!r} is not a file")
    return paths


def _eval_settings(**options: Any) -> EvalSettings:
    """`sao.eval.EvalSettings` of the options; exits 2 with its error when it refuses them."""
    from sao.eval import EvalSettings

    try:
        return EvalSettings(**options)
    except ValueError as err:
        raise _fail(f"error: {err}") from None


def _eval_table(report: dict[str, Any], title: str, k: int) -> Table:
    """One row per task file, then the overall row: tasks, samples, pass@1, pass@k, reward, turns, errors."""
    table = Table(title=title)
    for column in ("task file", "tasks", "samples", "pass@1", f"pass@{k}", "mean reward", "turns", "errors"):
        table.add_column(column, no_wrap=True, justify="left" if column == "task file" else "right")
    rows = [*report["files"].items(), ("overall", report["overall"])]
    for i, (name, m) in enumerate(rows):
        table.add_row(
            name,
            str(m["tasks"]),
            str(m["samples"]),
            f"{m['pass@1']:.3f}",
            f"{m[f'pass@{k}']:.3f}",
            f"{m['mean_reward']:.3f}",
            f"{m['mean_turns']:.1f}",
            str(m["errors"]),
            end_section=i == len(rows) - 2,
        )
    return table


@app.command("plot")
def plot_command(
    runs: Annotated[
        list[str], typer.Argument(metavar="RUN_DIR...", help="Run directories (each with metrics.jsonl).")
    ],
    out: Annotated[
        str | None, typer.Option("--out", help="PNG to write (default: FIRST_RUN_DIR/metrics.png).")
    ] = None,
    smooth: Annotated[int, typer.Option("--smooth", min=1, help="Smoothing window in points (1: none).")] = 1,
    smoothing: Annotated[
        str, typer.Option("--smoothing", help="mean (trailing moving average) or ema (span = --smooth).")
    ] = "mean",
) -> None:
    """Plot the standard panels (reward, critic EV, critic grad norm, DIS masked fraction, policy lag,
    throughput) of one or more runs into one PNG, runs overlaid."""
    from sao.runtime.plots import plot_runs, resolve_metrics_file

    if smoothing not in ("mean", "ema"):
        raise _fail(f"error: --smoothing: must be 'mean' or 'ema', got {smoothing!r}")
    for run in runs:
        try:
            resolve_metrics_file(run)
        except FileNotFoundError as err:
            raise _fail(f"error: RUN_DIR: {err}") from None
    first = Path(runs[0])
    target = Path(out) if out else (first.parent if first.is_file() else first) / "metrics.png"
    if target.suffix.lower() != ".png":
        raise _fail(f"error: --out: must end in .png, got {str(target)!r}")
    try:
        path = plot_runs(runs, target, window=smooth, kind=smoothing)  # type: ignore[arg-type]  # checked
    except OSError as err:
        raise _fail(f"error: cannot write {str(target)!r}: {err}", code=1) from None
    typer.echo(f"wrote {path}")


@app.command("train")
def train_command(
    args: ConfigArgs = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint in logging.run_dir.")
    ] = False,
) -> None:
    """Asynchronous RL training (or sync with runtime.mode=sync): engine (see engine.backend), producer,
    trainer.

    Every key and what it does: `sao config --explain [KEY]`; algorithms: `sao presets`; guides: docs/."""
    cfg = _config_from_args(args)
    from sao.runtime.runner import EngineStartError, RunStopped, train_sync_entry

    _quiet_transformers()
    try:
        result = train_sync_entry(cfg, resume=resume)
    except RunStopped as err:  # already printed by the run, with its checkpoint
        raise _fail(f"stopped: {err}", code=3) from None
    except (OSError, ValueError, EngineStartError) as err:
        raise _fail(f"error: {err}", code=1) from None
    typer.echo(
        f"trained {result.steps} steps (policy version {result.policy_version}); run dir {result.run_dir}; "
        f"trajectories {result.counters}"
    )
