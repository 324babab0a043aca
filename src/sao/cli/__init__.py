"""The `sao` command line.

Module import stays light (no torch/transformers): commands import heavy modules inside their bodies.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from sao import __version__
from sao.config import AlgoConfig, ConfigError, CriticConfig, dump_config, load_config
from sao.presets import PRESET_DESCRIPTIONS, PRESETS

app = typer.Typer(
    name="sao",
    help="Single-Rollout Asynchronous Optimization: asynchronous, agentic RL for LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Width used when stdout is not a terminal (pipes, CI, tests), so tables are not squeezed to 80 columns.
_PIPE_WIDTH = 200


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"sao {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Single-Rollout Asynchronous Optimization: asynchronous, agentic RL for LLMs."""


def _stdout() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=_PIPE_WIDTH)


def _fail(message: str, code: int = 2) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(message, style="red", markup=False, highlight=False)
    return typer.Exit(code)


def _quiet_transformers() -> None:
    """No shard/load progress bars or load reports (a critic built from a policy checkpoint has an
    'unexpected' LM head and a 'missing' value head by design); sao prints its own progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """`[CONFIG.yaml] [key=value ...]`: the first argument is the config file unless it is an override."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


@app.command("config")
def config_command(
    args: Annotated[
        list[str] | None,
        typer.Argument(metavar="[CONFIG.yaml] [KEY=VALUE]...", help="Config file, then dotted overrides."),
    ] = None,
) -> None:
    """Load and validate a config, then print it fully resolved (defaults, preset, file, overrides)."""
    path, overrides = _split_config_args(args or [])
    try:
        cfg = load_config(path, overrides)
    except ConfigError as err:
        raise _fail(f"error: {err}") from None
    text = dump_config(cfg)
    if sys.stdout.isatty():
        _stdout().print(Syntax(text, "yaml", background_color="default"))
    else:
        typer.echo(text, nl=False)


@app.command("presets")
def presets_command() -> None:
    """List the algorithm presets (`algo=NAME` on the command line selects one)."""
    table = Table()
    for column in ("name", "advantage", "loss", "eps band", "K", "critic freeze", "group"):
        table.add_column(column, no_wrap=True)
    table.add_column("description")
    for name, preset in PRESETS.items():
        algo = AlgoConfig(**preset["algo"])
        freeze = CriticConfig(**preset.get("critic", {})).freeze
        table.add_row(
            name,
            algo.advantage,
            algo.policy_loss,
            f"{algo.eps_low}/{algo.eps_high}",
            str(algo.k_critic) if algo.uses_critic else "-",
            str(freeze) if algo.uses_critic else "-",
            str(algo.group_size),
            PRESET_DESCRIPTIONS[name],
        )
    _stdout().print(table)


@app.command("init-model")
def init_model_command(
    out: Annotated[str, typer.Option("--out", help="Directory to write the checkpoint into.")],
    arch: Annotated[str, typer.Option("--arch", help="Architecture: qwen3_moe or qwen3.")] = "qwen3_moe",
    size: Annotated[
        str, typer.Option("--size", help="Size: test (unit tests) or small (CPU quickstart).")
    ] = "test",
    seed: Annotated[int, typer.Option("--seed", help="Weight initialisation seed.")] = 0,
) -> None:
    """Write a tiny randomly initialised Hugging Face checkpoint (weights, config, tokenizer)."""
    # Heavy (torch, transformers): imported on use, so `import sao.cli` stays light.
    from sao.models.tiny import TINY_ARCHS, TINY_SIZES, count_parameters, tiny_checkpoint, tiny_config

    if arch not in TINY_ARCHS:
        raise _fail(f"error: --arch: unknown architecture {arch!r}; choose one of {', '.join(TINY_ARCHS)}")
    if size not in TINY_SIZES:
        raise _fail(f"error: --size: unknown size {size!r}; choose one of {', '.join(TINY_SIZES)}")
    _quiet_transformers()  # the command prints one line
    try:
        path = tiny_checkpoint(out, arch, size, seed)  # type: ignore[arg-type]  # checked above
    except OSError as err:
        raise _fail(f"error: cannot write {out!r}: {err}", code=1) from None
    params = count_parameters(tiny_config(arch, size))  # type: ignore[arg-type]
    typer.echo(f"wrote {arch}/{size} checkpoint (seed {seed}, {params:,} parameters) to {path}")


@app.command("sft")
def sft_command(
    model: Annotated[str, typer.Option("--model", help="Checkpoint directory to fine-tune.")],
    data: Annotated[str, typer.Option("--data", help='Chat JSONL: {"messages": [...]} per line.')],
    out: Annotated[str, typer.Option("--out", help="Directory for the fine-tuned checkpoint.")],
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 200,
    lr: Annotated[
        float, typer.Option(help="Peak learning rate (tiny models ~1e-3, real ones ~1e-5).")
    ] = 1e-3,
    batch_size: Annotated[int, typer.Option(help="Conversations per step.")] = 16,
    max_tokens: Annotated[int, typer.Option(help="Tokens per conversation (longer ones truncated).")] = 2048,
    eval_frac: Annotated[float, typer.Option(help="Held-out share for the eval loss.")] = 0.1,
    eval_every: Annotated[int, typer.Option(help="Steps between eval losses.")] = 25,
    seed: Annotated[int, typer.Option(help="Data order and split seed.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
) -> None:
    """Supervised warm start: loss on assistant tokens only (the RL action mask)."""
    from sao.train.sft import SFTOptions, run_sft

    _quiet_transformers()
    opts = SFTOptions(
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        max_tokens=max_tokens,
        eval_frac=eval_frac,
        eval_every=eval_every,
        seed=seed,
        device=device,
    )
    try:
        run_sft(model, data, out, opts)
    except (OSError, ValueError) as err:
        raise _fail(f"error: {err}", code=1) from None


@app.command("pretrain-value")
def pretrain_value_command(
    model: Annotated[str, typer.Option("--model", help="Policy checkpoint the critic starts from.")],
    corpus: Annotated[str, typer.Option("--corpus", help="JSONL of Trajectory from the initial policy.")],
    out: Annotated[str, typer.Option("--out", help="Directory for the pretrained critic.")],
    corpus_size: Annotated[
        int, typer.Option(help="Trajectories used (sampled if the file has more).")
    ] = 1024,
    max_steps: Annotated[int, typer.Option(help="Upper bound on critic steps.")] = 200,
    ev_patience: Annotated[int, typer.Option(help="Evaluations without EV gain before stopping.")] = 10,
    ev_min_delta: Annotated[float, typer.Option(help="EV gain that counts as improvement.")] = 0.01,
    lr: Annotated[float, typer.Option(help="Critic learning rate.")] = 5e-6,
    batch_size: Annotated[int, typer.Option(help="Trajectories per critic step.")] = 32,
    eval_every: Annotated[int, typer.Option(help="Steps between held-out EV evaluations.")] = 5,
    freeze: Annotated[str, typer.Option(help="Critic parameters frozen: none or attention.")] = "none",
    gamma: Annotated[float, typer.Option(help="Discount of the Monte-Carlo returns.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Sampling and split seed.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
) -> None:
    """Pretrain the critic on Monte-Carlo returns of the initial policy (the paper's cold-start fix)."""
    from sao.train.value_pretrain import ValuePretrainOptions, run_value_pretrain

    _quiet_transformers()
    if freeze not in ("none", "attention"):
        raise _fail(f"error: --freeze: must be 'none' or 'attention', got {freeze!r}")
    opts = ValuePretrainOptions(
        corpus_size=corpus_size,
        max_steps=max_steps,
        ev_patience=ev_patience,
        ev_min_delta=ev_min_delta,
        lr=lr,
        batch_size=batch_size,
        eval_every=eval_every,
        freeze=freeze,
        gamma=gamma,
        seed=seed,
        device=device,
    )
    try:
        run_value_pretrain(model, corpus, out, opts)
    except (OSError, ValueError) as err:
        raise _fail(f"error: {err}", code=1) from None


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
) -> None:
    """OpenAI-compatible gateway: chat/completions and completions with token ids and log-probs; each
    session (X-Session-Id header or session_id field) is recorded token-in/token-out as a trajectory and
    closed by POST /v1/sessions/{id}/reward."""
    import uvicorn

    from sao.engine.gateway import create_app
    from sao.engine.local import LocalEngine
    from sao.models.loading import load_tokenizer

    _quiet_transformers()
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
    app_ = create_app(
        engine,
        tokenizer,
        model_name=Path(model).name,
        default_max_tokens=max_tokens,
        output_path=out,
        own_engine=True,
    )
    typer.echo(f"sao gateway for {model} on http://{host}:{port}/v1 (trajectories -> {out or 'memory only'})")
    uvicorn.run(app_, host=host, port=port, log_level="warning")


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
        bool, typer.Option(help="Keep every sample's decoded episode text in the --out report.")
    ] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")] = "auto",
) -> None:
    """Evaluate a checkpoint: every task k times through the agent loop; Pass@1 (mean over the k samples)
    and pass@k per task file and overall."""
    from sao.eval import EvalSettings, run_eval, write_report

    _quiet_transformers()
    paths = [p.strip() for value in tasks for p in value.split(",") if p.strip()]
    for path in paths:
        if not Path(path).is_file():
            raise _fail(f"error: --tasks: {path!r} is not a file")
    try:
        settings = EvalSettings(
            k=k,
            seed=seed,
            temperature=temperature,
            top_p=top_p,
            max_turns=max_turns,
            max_tokens_per_turn=max_tokens_per_turn,
            max_total_tokens=max_total_tokens,
            concurrency=concurrency,
            env=env,
            limit=limit,
            transcripts=transcripts,
        )
    except ValueError as err:
        raise _fail(f"error: {err}") from None
    try:
        report = run_eval(model, paths, settings, device=device, dtype=dtype)
    except (OSError, ValueError) as err:  # EnvError is a ValueError
        raise _fail(f"error: {err}", code=1) from None
    table = Table(title=f"{Path(model).name}: k={k}, temperature {temperature}, top-p {top_p}, seed {seed}")
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
    _stdout().print(table)
    if out:
        typer.echo(f"wrote {write_report(report, out)}")


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
    args: Annotated[
        list[str] | None,
        typer.Argument(metavar="[CONFIG.yaml] [KEY=VALUE]...", help="Config file, then dotted overrides."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint in logging.run_dir.")
    ] = False,
) -> None:
    """Asynchronous RL training (or sync with runtime.mode=sync): engine, producer, trainer in one process."""
    path, overrides = _split_config_args(args or [])
    try:
        cfg = load_config(path, overrides)
    except ConfigError as err:
        raise _fail(f"error: {err}") from None
    from sao.runtime.runner import train_sync_entry

    _quiet_transformers()
    try:
        result = train_sync_entry(cfg, resume=resume)
    except (OSError, ValueError) as err:
        raise _fail(f"error: {err}", code=1) from None
    typer.echo(
        f"trained {result.steps} steps (policy version {result.policy_version}); run dir {result.run_dir}; "
        f"trajectories {result.counters}"
    )


if __name__ == "__main__":
    app()
