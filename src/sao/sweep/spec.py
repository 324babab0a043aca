"""A sweep spec: a grid of arms × seeds over one base run config, and what its report shows.

A spec is YAML (``sao sweep SPEC.yaml``)::

    name: c1_sao_vs_grpo            # the report's title and default output folder
    description: SAO > GRPO+DIS > GRPO on calculator
    base: experiments/base/calculator.yaml   # a run config (paths relative to the working directory)
    overrides: [trainer.total_steps=120]     # dotted overrides for every arm
    seeds: [0, 1, 2, 3, 4]          # or a count: 5 means 0..4
    seed_keys: [trainer.seed, data.seed]     # each set to the seed
    jobs: 1                         # runs at once (each gets cores / jobs torch threads)
    runs_root: runs/sweeps/runs     # where run dirs live (shared by specs: an equal run is run once)
    arms:
      - {name: sao, preset: sao}
      - {name: grpo, preset: grpo, overrides: [trainer.lr=1e-4]}
    smoke:                          # `sao sweep --smoke`: 1 seed, a few steps (see SMOKE_OVERRIDES)
      overrides: [model.path=null, model.tiny_arch=qwen3_moe]
    report:
      curves: [reward/mean, eval/pass@1]
      finals:
        - {metric: eval/pass@1, how: last}
        - {metric: reward/mean, how: tail, frac: 0.2}

One run's overrides, in this order (a later one wins): ``overrides``, ``algo=<preset>``, the arm's
``overrides``, the seed keys, (``--smoke``: `SMOKE_OVERRIDES` then ``smoke.overrides``), and last
``logging.run_dir`` and ``name``, all over the base file. The preset itself fills only the fields that no
file or override sets (`load_config`), so an ``algo.*`` key in the spec's ``overrides`` applies to every
arm whatever its preset. A run is identified by its resolved config without ``logging.run_dir``
and ``name`` (`run_key`): two arms — of one spec or of two — that resolve to the same config share one run
dir, so a baseline several claims compare against is trained once.

Owns: the spec's schema and its expansion into planned runs. Does not own: running them (`execute`) or
reading their metrics (`aggregate`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sao.config import ConfigError, RunConfig, load_config
from sao.sweep.legacy_keys import legacy_algo

__all__ = [
    "DEFAULT_CURVES",
    "SMOKE_OVERRIDES",
    "Arm",
    "Final",
    "PlannedRun",
    "ReportSpec",
    "SweepSpec",
    "load_spec",
    "plan_runs",
    "run_key",
]

DEFAULT_CURVES = (
    "reward/mean",
    "eval/pass@1",
    "critic/explained_variance",
    "critic/grad_norm",
    "dis/masked_frac",
    "lag/token_mean",
)

# `--smoke`: every arm for a few steps at toy sizes, so a spec keeps working (the test suite runs them).
SMOKE_OVERRIDES = (
    "trainer.total_steps=2",
    "trainer.batch_size=8",
    "critic.pretrain.corpus_size=8",
    "critic.pretrain.max_steps=2",
    "engine.max_new_tokens=16",
    "engine.max_concurrent=8",
    "eval.k=1",
    "eval.limit=2",
    "eval.concurrency=4",
    "logging.eval_every=null",
    "logging.checkpoint_every=2",
    "logging.tensorboard=false",
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Arm(_Strict):
    """One arm: a preset plus overrides."""

    name: str = Field(..., description="Label in reports and run dirs (letters, digits, _ . -).")
    preset: str | None = Field(None, description="`algo=<preset>` before the arm's overrides; null: none.")
    overrides: list[str] = Field(default_factory=list, description="Dotted overrides of this arm.")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"arm name {value!r} must be letters, digits, '_', '.' or '-'")
        return value


class Final(_Strict):
    """A final metric: one number per run, then a mean with an interval per arm.

    ``how``: ``last`` (the last logged value: the final evaluation for ``eval/*``), ``tail`` / ``head``
    (mean of the last / first ``frac`` of the logged values), ``mean`` (all of them), ``roughness`` (mean
    |difference| of consecutive values: lower = smoother), ``max``, ``min``, ``drop`` (the best value of the
    ``smooth``-point trailing mean minus the mean of the last ``frac``: how far a run fell from its best,
    0 for one that never fell — a collapse measure), ``recovery`` (steps until the
    ``smooth``-point trailing mean is back to ``fraction`` of its level over the ``pre_window`` steps before
    each shift; ``shifts``: shift points in trained trajectories).
    """

    metric: str
    how: Literal["last", "tail", "head", "mean", "roughness", "max", "min", "drop", "recovery"] = "last"
    frac: float = Field(0.2, gt=0, le=1)
    shifts: list[int] = Field(default_factory=list, description="recovery: shifts, in trained trajectories.")
    pre_window: int = Field(10, ge=1)
    fraction: float = Field(0.9, gt=0, le=1)
    smooth: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _fields_fit_how(self) -> Final:
        if self.how == "recovery" and not self.shifts:
            raise ValueError(f"final {self.metric}: how=recovery needs shifts (in trained trajectories)")
        if self.how == "recovery" and any(b <= a for a, b in zip(self.shifts, self.shifts[1:], strict=False)):
            raise ValueError(f"final {self.metric}: shifts must increase, got {self.shifts}")
        uses = {"frac": ("tail", "head", "drop"), "smooth": ("drop", "recovery"), "shifts": ("recovery",),
                "pre_window": ("recovery",), "fraction": ("recovery",)}  # fmt: skip
        for key, hows in uses.items():
            if key in self.model_fields_set and self.how not in hows:
                raise ValueError(
                    f"final {self.metric}: {key} applies to how={'/'.join(hows)}, not {self.how}"
                )
        return self

    @property
    def label(self) -> str:
        """Column name: ``metric`` for ``last``, else ``metric (how)``."""
        if self.how == "last":
            return self.metric
        if self.how in ("tail", "head"):
            return f"{self.metric} ({self.how} {self.frac:g})"
        if self.how == "drop":
            return f"{self.metric} (drop from best, tail {self.frac:g})"
        return f"{self.metric} ({self.how})"


class ReportSpec(_Strict):
    """What `sao report` draws and tabulates."""

    curves: list[str] = Field(default_factory=lambda: list(DEFAULT_CURVES))
    finals: list[Final] = Field(
        default_factory=lambda: [Final(metric="eval/pass@1"), Final(metric="reward/mean", how="tail")]
    )
    smooth: int = Field(5, ge=1, description="Trailing moving average of each run's curve, in points.")
    x: list[Literal["step", "trajectories", "wall"]] = Field(
        default_factory=lambda: ["step", "trajectories", "wall"]
    )

    @model_validator(mode="after")
    def _distinct_labels(self) -> ReportSpec:
        labels = [f.label for f in self.finals]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"finals: two finals would share the column {twice[0]!r}; keep one")
        return self


class SmokeSpec(_Strict):
    overrides: list[str] = Field(default_factory=list, description="After SMOKE_OVERRIDES.")


class SweepSpec(_Strict):
    """A grid of arms × seeds; see the module docstring."""

    name: str
    description: str = ""
    base: str | None = Field(None, description="Base run config (YAML); null: defaults plus overrides.")
    overrides: list[str] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2, 3, 4])
    seed_keys: list[str] = Field(default_factory=lambda: ["trainer.seed", "data.seed"])
    jobs: int = Field(1, ge=1)
    runs_root: str = "runs/sweeps/runs"
    out: str | None = Field(None, description="Report folder; null: runs/sweeps/<name>.")
    arms: list[Arm]
    smoke: SmokeSpec = Field(default_factory=SmokeSpec)
    report: ReportSpec = Field(default_factory=ReportSpec)

    @field_validator("seeds", mode="before")
    @classmethod
    def _count_or_list(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ValueError(f"seeds: a count must be >= 1, got {value}")
            return list(range(value))
        return value

    @model_validator(mode="after")
    def _distinct(self) -> SweepSpec:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r} must be letters, digits, '_', '.' or '-'")
        if not self.arms:
            raise ValueError("arms: at least one arm")
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arms: names must be distinct, got {names}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: must be distinct and non-empty, got {self.seeds}")
        if len(self.seeds) > 1 and not self.seed_keys:
            raise ValueError("seed_keys: empty, so every seed would be the same run; name the keys to set")
        return self

    @property
    def out_dir(self) -> Path:
        return Path(self.out) if self.out else Path("runs/sweeps") / self.name


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a spec; `ConfigError` names the file and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read sweep spec {str(path)!r}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"sweep spec {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"sweep spec {str(path)!r} must be a mapping")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as err:
        lines = [
            f"{'.'.join(str(p) for p in e['loc']) or '(spec)'}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        ]
        raise ConfigError(f"sweep spec {str(path)!r}: " + "; ".join(lines)) from None


@dataclass(frozen=True)
class PlannedRun:
    """One arm × seed: the overrides that make its config, the config, and its run dir."""

    arm: str
    seed: int
    overrides: tuple[str, ...]  # after the base file, without logging.run_dir / name
    config: RunConfig
    run_dir: Path

    @property
    def key(self) -> str:
        return self.run_dir.name.rsplit("-", 1)[-1]

    def command_overrides(self) -> list[str]:
        """Everything `sao train BASE ...` needs after the base file."""
        return [*self.overrides, f"logging.run_dir={self.run_dir}", f"name={self.arm}"]


def _non_default(model: BaseModel) -> dict[str, Any]:
    """The fields of ``model`` whose values differ from their defaults (nested sections recursed; a field
    without a default always kept), as plain JSON data."""
    out: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            sub = _non_default(value)
            if sub:
                out[name] = sub
            continue
        plain = model.model_dump(mode="json", include={name})[name]
        if info.is_required():
            out[name] = plain
            continue
        default = info.get_default(call_default_factory=True)
        default = default.model_dump(mode="json") if isinstance(default, BaseModel) else _plain(default)
        if plain != default:
            out[name] = plain
    return out


def _plain(value: Any) -> Any:
    """``value`` as JSON data (the form ``model_dump(mode="json")`` gives a field)."""
    return json.loads(json.dumps(value, default=str))


def run_key(cfg: RunConfig) -> str:
    """12 hex digits identifying a run by the values its resolved config sets away from the defaults,
    ``logging.run_dir`` and ``name`` left out. A key added to the config later (with a default) leaves the
    keys of existing runs as they were, so a finished run stays found; so does a changed default. The
    ``algo`` section counts in its earlier flat spelling (`sao.sweep.legacy_keys`)."""
    data = _non_default(cfg)
    algo = legacy_algo(cfg.algo.model_dump(mode="json"))
    data.pop("algo", None)
    if algo:
        data["algo"] = algo
    data.pop("name", None)
    data.get("logging", {}).pop("run_dir", None)
    if data.get("logging") == {}:  # only the run dir set there: as if the section had no change
        data.pop("logging")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def arm_overrides(spec: SweepSpec, arm: Arm, seed: int, *, smoke: bool = False) -> list[str]:
    """The overrides of one arm × seed, lowest precedence first (see the module docstring)."""
    preset = [f"algo={arm.preset}"] if arm.preset else []
    seeds = [f"{key}={seed}" for key in spec.seed_keys]
    extra = [*SMOKE_OVERRIDES, *spec.smoke.overrides] if smoke else []
    return [*spec.overrides, *preset, *arm.overrides, *seeds, *extra]


def plan_runs(spec: SweepSpec, *, smoke: bool = False) -> list[PlannedRun]:
    """Every arm × seed, seed-major (seed 0 of every arm first: an interrupted sweep stays balanced).

    ``smoke``: the first seed only, with the smoke overrides. Raises `ConfigError` naming the arm and seed
    when a run's config does not load.
    """
    seeds = spec.seeds[:1] if smoke else spec.seeds
    root = Path(spec.runs_root)
    planned = []
    for seed in seeds:
        for arm in spec.arms:
            overrides = arm_overrides(spec, arm, seed, smoke=smoke)
            try:
                cfg = load_config(spec.base, [*overrides, f"name={arm.name}"])
            except ConfigError as err:
                raise ConfigError(f"arm {arm.name!r}, seed {seed}: {err}") from None
            run_dir = root / f"s{seed}-{run_key(cfg)}"  # no arm name: equal configs share it
            cfg = cfg.model_copy(update={"logging": cfg.logging.model_copy(update={"run_dir": str(run_dir)})})
            planned.append(PlannedRun(arm.name, seed, tuple(overrides), cfg, run_dir))
    return planned
