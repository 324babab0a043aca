"""`sao plan`: the resource plan and the throughput model (a discrete-event simulation) of a run config.

Pure Python (no torch): `sao.plan` simulates the producer, the engine replicas, the trainer and the weight
pushes with stage constants from a calibration file (`sao plan --calibrate RUN_DIR`), a named profile or
explicit flags; it never invents rates. See docs/planner.md.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from sao.cli.common import ConfigArgs, _config_from_args, _fail, _stdout, app
from sao.cli.plan_throughput import Scenario, Simulation, report_throughput
from sao.config import ConfigError, RunConfig
from sao.plan import (
    EmpiricalWorkload,
    EngineCosts,
    Layout,
    ParametricWorkload,
    StageCosts,
    TrainerCosts,
    Workload,
    budget_workload,
    calibrate,
    config_inputs,
    parse_dist,
)
from sao.plan.calibrate import CalibrationError
from sao.plan.costs import CostsError
from sao.plan.from_config import ConfigInputs
from sao.plan.workload import EPISODES_FILE, WorkloadError

NO_COSTS = (
    "the throughput model needs stage constants: --calibration FILE (from `sao plan --calibrate "
    "RUN_DIR`), --profile NAME, or explicit --engine-t0/--engine-t1/--engine-c/--engine-p and "
    "--trainer-a/--trainer-b [--push-s]"
)

Opt = typer.Option
_ENGINE_KEYS = ("t0_s", "t1_s", "c_s", "p_s")
_TRAINER_KEYS = ("a_s", "b_s", "scaling_eff", "critic_step_factor")

# The options whose help does not fit on the signature's line.
_CalibrateDir = Annotated[Path | None, Opt("--calibrate", help="Fit stage constants from RUN_DIR.")]
_CalibrationOut = Annotated[
    Path | None, Opt("--out", help="With --calibrate: write the calibration JSON here.")
]
_GenTokens = Annotated[
    str | None, Opt(help="Generated tokens per turn, e.g. 'lognormal:median=800,sigma=0.7'.")
]
_EnvSeconds = Annotated[
    str | None, Opt(help="Env seconds per turn, e.g. 'lognormal:median=2,sigma=1,max=60'.")
]
_PrefixCache = Annotated[
    bool | None,
    Opt(
        "--prefix-cache/--no-prefix-cache",
        help="Engines keep an episode's earlier turns' KV (a turn prefills only its new tokens); "
        "default: the config's engine (sao's engines keep it unless engine.prefix_caching is off).",
    ),
]


@dataclasses.dataclass(frozen=True)
class _CostFlags:
    """Explicit stage constants (`StageCosts` field names); None: not given."""

    t0_s: float | None
    t1_s: float | None
    c_s: float | None
    p_s: float | None
    a_s: float | None
    b_s: float | None
    scaling_eff: float | None
    critic_step_factor: float | None
    push_s: float | None


@dataclasses.dataclass(frozen=True)
class _WorkloadSpecs:
    """Parametric workload distributions (`parse_dist` specs); None: not given."""

    turns: str | None
    gen_tokens: str | None
    obs_tokens: str | None
    prompt_tokens: str | None
    env_s: str | None


def resource_plan(cfg: RunConfig) -> tuple[Any, Any]:
    """``(plan, renderable)``: the static resource plan (`sao.plan.resources`) and its table."""
    from sao.plan.resource_table import format_resource_plan
    from sao.plan.resources import resource_plan as plan_resources

    plan = plan_resources(cfg)
    return plan, format_resource_plan(plan)


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json") if callable(dump) else str(obj)


def _costs(
    calibration: Path | None, profile: str | None, flags: _CostFlags, critic_steps: int
) -> StageCosts | None:
    """Stage constants: a calibration file or a profile, then explicit flags on top (explicit trainer a/b
    are for one worker); None when nothing is given."""
    base: StageCosts | None = None
    if calibration is not None:
        base = StageCosts.read(calibration)
    elif profile is not None:
        from sao.plan.peers import profile_costs

        base = profile_costs(profile)
    given = {k: v for k, v in dataclasses.asdict(flags).items() if v is not None}
    if base is None and not given:
        return None
    if base is None:
        if not {"t0_s", "t1_s", "c_s"} & set(given) or not {"a_s", "b_s"} & set(given):
            raise CostsError(f"explicit stage constants need an engine and a trainer cost ({NO_COSTS})")
        engine = EngineCosts(*(given.get(k, 0.0) for k in _ENGINE_KEYS))
        base = StageCosts(engine, TrainerCosts(given.get("a_s", 0.0), given.get("b_s", 0.0)), source="flags")
    elif given:
        base = dataclasses.replace(base, source=f"{base.source} + flags {', '.join(sorted(given))}")
    engine = dataclasses.replace(base.engine, **{k: v for k, v in given.items() if k in _ENGINE_KEYS})
    trainer = dataclasses.replace(base.trainer, **{k: v for k, v in given.items() if k in _TRAINER_KEYS})
    if trainer.critic_step_factor:  # a calibrated a/b holds the preset's K already; the factor adds to it
        trainer = dataclasses.replace(trainer, critic_steps=critic_steps)
    return dataclasses.replace(base, engine=engine, trainer=trainer, push_s=given.get("push_s", base.push_s))


def _workload(run_dir: Path | None, specs: _WorkloadSpecs, inputs: ConfigInputs, cfg: RunConfig) -> Workload:
    """Recorded episodes, parametric flags, the config's own run directory, else the budget bound."""
    if run_dir is not None:
        return EmpiricalWorkload.from_run_dir(run_dir)
    given = {k: parse_dist(v) for k, v in dataclasses.asdict(specs).items() if v is not None}
    if given:
        return ParametricWorkload(
            **given,
            max_turns=inputs.max_turns,
            max_new_tokens=inputs.max_new_tokens,
            max_total_tokens=inputs.max_total_tokens,
        )  # type: ignore[arg-type]
    if (Path(cfg.logging.run_dir) / EPISODES_FILE).is_file():
        return EmpiricalWorkload.from_run_dir(cfg.logging.run_dir)
    return budget_workload(inputs)


def _calibrate_only(run_dir: Path, out: Path | None, as_json: bool) -> None:
    from sao.plan.report import costs_table

    try:
        costs = calibrate(run_dir)
    except (CalibrationError, CostsError) as err:
        raise _fail(f"error: {err}") from None
    if out is not None:
        costs.write(out)
    if as_json:
        typer.echo(json.dumps(costs.to_json(), indent=2))
        return
    console = _stdout()
    console.print(costs_table(costs))
    if out is not None:
        console.print(f"wrote {out} (use it with: sao plan CONFIG --calibration {out})", highlight=False)


@app.command("plan")
def plan_command(
    args: ConfigArgs = None,
    calibrate_dir: _CalibrateDir = None,
    out: _CalibrationOut = None,
    calibration: Annotated[Path | None, Opt("--calibration", help="Calibration JSON to use.")] = None,
    profile: Annotated[str | None, Opt("--profile", help="Named profile of stage constants (docs).")] = None,
    workload_dir: Annotated[Path | None, Opt("--workload", help="Resample RUN_DIR/episodes.jsonl.")] = None,
    turns: Annotated[str | None, Opt(help="Turns per episode, e.g. 'power:alpha=1.5,max=50'.")] = None,
    gen_tokens: _GenTokens = None,
    obs_tokens: Annotated[str | None, Opt(help="Observation tokens per turn.")] = None,
    prompt_tokens: Annotated[str | None, Opt(help="Prompt tokens.")] = None,
    env_s: _EnvSeconds = None,
    engine_t0: Annotated[float | None, Opt(help="Engine seconds per step.")] = None,
    engine_t1: Annotated[float | None, Opt(help="Engine seconds per sequence per step.")] = None,
    engine_c: Annotated[float | None, Opt(help="Engine seconds per context token per step.")] = None,
    engine_p: Annotated[float | None, Opt(help="Engine seconds per prefill token.")] = None,
    trainer_a: Annotated[float | None, Opt(help="Trainer seconds per step.")] = None,
    trainer_b: Annotated[float | None, Opt(help="Trainer seconds per batch token.")] = None,
    trainer_eff: Annotated[float | None, Opt(help="Trainer worker-scaling efficiency (0, 1].")] = None,
    critic_step_factor: Annotated[float | None, Opt(help="Cost of a critic step / actor step (× K).")] = None,
    push_s: Annotated[float | None, Opt(help="Seconds per weight push.")] = None,
    engines: Annotated[int | None, Opt(help="Engine replicas (default cluster.engine_replicas).")] = None,
    trainers: Annotated[int | None, Opt(help="Trainer workers (default cluster.trainer_workers).")] = None,
    gpus: Annotated[int | None, Opt(help="GPU pool: also sweep its engine/trainer split.")] = None,
    gpus_per_engine: Annotated[float | None, Opt(help="GPUs per engine replica.")] = None,
    gpus_per_trainer: Annotated[float | None, Opt(help="GPUs per trainer worker.")] = None,
    mode: Annotated[str, Opt(help="sync, async or both.")] = "both",
    colocated: Annotated[bool, Opt(help="Sync mode on one pool time-shared by engines and trainer.")] = False,
    prefix_cache: _PrefixCache = None,
    steps: Annotated[int, Opt(help="Trainer steps simulated.")] = 12,
    warmup: Annotated[int, Opt(help="Steps left out of the measurement.")] = 2,
    seed: Annotated[int, Opt(help="Workload sampling seed.")] = 0,
    stride: Annotated[int, Opt(help="With --gpus: simulate every N-th replica count.")] = 1,
    as_json: Annotated[bool, Opt("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Plan a run: its resources, then trained trajectories/hour, utilisations and lag, sync and async."""
    if calibrate_dir is not None:
        _calibrate_only(calibrate_dir, out, as_json)
        return
    cfg = _config_from_args(args)
    _check_mode(mode, colocated)
    resources, resources_error = _try_resource_plan(cfg)
    inputs = _with_prefix_cache(config_inputs(cfg), prefix_cache)
    engine_flags = (engine_t0, engine_t1, engine_c, engine_p)
    trainer_flags = (trainer_a, trainer_b, trainer_eff, critic_step_factor)
    flags = _CostFlags(*engine_flags, *trainer_flags, push_s)
    specs = _WorkloadSpecs(turns, gen_tokens, obs_tokens, prompt_tokens, env_s)
    sizes = (engines, trainers, gpus_per_engine, gpus_per_trainer)
    costs, scenario = _model_inputs(cfg, inputs, calibration, profile, flags, workload_dir, specs, sizes)
    report = _start_report((args or [None])[0], resources, resources_error, as_json)
    if costs is None:
        _report_no_costs(report, as_json)
        return
    simulation = Simulation(mode, colocated, gpus, steps, warmup, seed, stride)
    report_throughput(report, costs, scenario, simulation, as_json)


def _check_mode(mode: str, colocated: bool) -> None:
    """Exit 2 unless ``mode`` is sync, async or both, and ``colocated`` goes with a sync mode."""
    if mode not in ("sync", "async", "both"):
        raise _fail(f"error: --mode: must be sync, async or both, got {mode!r}")
    if colocated and mode == "async":
        raise _fail("error: --colocated time-shares the GPUs: it applies to sync mode only")


def _try_resource_plan(cfg: RunConfig) -> tuple[tuple[Any, Any] | None, str | None]:
    """``(resource_plan(cfg), None)``, or ``(None, the error)`` when the plan cannot be made (e.g. model.path
    not written yet): the throughput model still runs."""
    try:
        return resource_plan(cfg), None
    except (ConfigError, ValueError) as err:
        return None, str(err)


def _with_prefix_cache(inputs: ConfigInputs, prefix_cache: bool | None) -> ConfigInputs:
    """``inputs`` with ``--prefix-cache/--no-prefix-cache`` applied to its policy (None: the config's)."""
    if prefix_cache is None:
        return inputs
    policy = dataclasses.replace(inputs.policy, prefix_cache=prefix_cache)
    return dataclasses.replace(inputs, policy=policy)


def _model_inputs(
    cfg: RunConfig,
    inputs: ConfigInputs,
    calibration: Path | None,
    profile: str | None,
    flags: _CostFlags,
    workload_dir: Path | None,
    specs: _WorkloadSpecs,
    sizes: tuple[int | None, int | None, float | None, float | None],
) -> tuple[StageCosts | None, Scenario]:
    """Stage constants, workload and layout (``sizes``: engines, trainers, GPUs per engine and per trainer;
    None: the config's); exits 2 with the error when one is invalid."""
    engines, trainers, gpus_per_engine, gpus_per_trainer = sizes
    try:
        costs = _costs(calibration, profile, flags, inputs.critic_steps)
        workload = _workload(workload_dir, specs, inputs, cfg)
        base = inputs.layout
        layout = Layout(
            engines or base.engine_replicas,
            trainers or base.trainer_workers,
            gpus_per_engine or base.gpus_per_engine,
            gpus_per_trainer or base.gpus_per_trainer,
        )
    except (CostsError, WorkloadError, ValueError) as err:
        raise _fail(f"error: {err}") from None
    return costs, Scenario(workload, layout, inputs.policy)


def _start_report(
    config: str | None, resources: tuple[Any, Any] | None, resources_error: str | None, as_json: bool
) -> dict[str, Any]:
    """The JSON report with its resource plan (or the error that prevented it); without ``--json`` the plan
    (or the reason it was skipped) is printed now."""
    report: dict[str, Any] = {"config": config, "resource_plan": None, "throughput": None}
    if resources is not None:
        report["resource_plan"] = _jsonable(resources[0])
    if resources_error is not None:
        report["resource_plan_error"] = resources_error
    console = _stdout()
    if not as_json and resources is not None:
        console.print(resources[1])
    if not as_json and resources_error is not None:
        console.print(
            f"resource plan skipped: {resources_error}", style="yellow", highlight=False, markup=False
        )
    return report


def _report_no_costs(report: dict[str, Any], as_json: bool) -> None:
    """Without stage constants there is no throughput: say which flags give them."""
    report["note"] = NO_COSTS
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _stdout().print(NO_COSTS, style="yellow", highlight=False)
