"""Fit the stage constants (`sao.plan.costs.StageCosts`) from a real run directory (`sao plan --calibrate`).

* **engine** ``t0, t1, c, p`` from ``RUN_DIR/timeline.jsonl`` (written when ``logging.timeline_every_s`` is
  set): between two samples the engine's cumulative counters give one equation
  ``Δbusy_s = t0·Δdecode_steps + t1·Δtokens_generated + c·Δcontext_tokens + p·Δprefill_tokens``.
  Intervals where a counter went down (an engine restart) or nothing moved are skipped. A term whose
  counter never moved, or moved in proportion to earlier terms (e.g. a constant batch makes
  ``tokens_generated ∝ decode_steps``), is not identifiable: it is dropped (set to 0, its cost is folded
  into the terms kept) and named in ``fit.engine.dropped``. The rest is fitted by non-negative least squares;
  a coefficient the constraint holds at 0 is named in ``fit.engine.clamped``.
* **trainer** ``a, b`` from ``RUN_DIR/metrics.jsonl``: ``runtime/train_s = a + b·batch/tokens`` over the
  trainer steps (non-negative least squares); when the batches' token counts barely vary, ``a`` and ``b``
  cannot be told apart and the fit is the proportional ``train_s = b·tokens`` (``a = 0``).
  ``push_s`` is the median of ``runtime/weight_push_s``. The K critic steps of the run's preset are inside
  the fitted ``a``/``b``; ``workers`` is the run's trainer ranks (``RUN_DIR/config.yaml``).
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

import yaml

from sao.jsonl import iter_jsonl

from .costs import EngineCosts, StageCosts, TrainerCosts
from .lsq import collinear_columns, nnls

__all__ = ["METRICS_FILE", "TIMELINE_FILE", "CalibrationError", "calibrate", "fit_engine", "fit_trainer"]

TIMELINE_FILE = "timeline.jsonl"
METRICS_FILE = "metrics.jsonl"
ENGINE_TERMS = (
    ("t0_s", "decode_steps"),
    ("t1_s", "tokens_generated"),
    ("c_s", "context_tokens"),
    ("p_s", "prefill_tokens"),
)
MIN_ENGINE_INTERVALS = 6
MIN_TRAINER_STEPS = 3
_CV_TOL = 1e-3  # relative spread of batch tokens under which a and b are not separable


class CalibrationError(ValueError):
    """The run directory cannot be calibrated from; the message names the file and what is missing."""


def _engine_samples(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        raise CalibrationError(f"{path}: no such file (set logging.timeline_every_s in the run's config)")
    samples = []
    keys = ["busy_s"] + [counter for _, counter in ENGINE_TERMS]
    for lineno, record in iter_jsonl(path, CalibrationError):
        engine = record.get("engine") if isinstance(record, dict) else None
        if not isinstance(engine, dict):
            raise CalibrationError(f"{path}:{lineno}: expected an 'engine' object")
        values = {k: engine.get(k, 0.0) for k in keys}
        bad = [k for k, v in values.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
        if "busy_s" not in engine or bad:
            raise CalibrationError(f"{path}:{lineno}: engine.{(bad or ['busy_s'])[0]} must be a number")
        samples.append({k: float(v) for k, v in values.items()})
    return samples


def fit_engine(path: str | Path) -> tuple[EngineCosts, dict[str, Any]]:
    """Engine constants from a timeline file, and the fit's report (see the module docstring)."""
    path = Path(path)
    samples = _engine_samples(path)
    deltas = []
    for before, after in itertools.pairwise(samples):
        d = {k: after[k] - before[k] for k in after}
        if min(d.values()) < 0 or max(d.values()) <= 0:
            continue  # a counter reset (engine restart), or an idle interval: no information
        deltas.append(d)
    if len(deltas) < MIN_ENGINE_INTERVALS:
        raise CalibrationError(
            f"{path}: {len(deltas)} usable intervals between {len(samples)} samples; the engine fit needs at "
            f"least {MIN_ENGINE_INTERVALS} (run longer, or lower logging.timeline_every_s)"
        )
    columns = [[d[counter] for d in deltas] for _, counter in ENGINE_TERMS]
    y = [d["busy_s"] for d in deltas]
    dropped = collinear_columns(columns)
    kept = [j for j in range(len(ENGINE_TERMS)) if j not in dropped]
    fit = nnls([columns[j] for j in kept], y)
    coef = dict.fromkeys((name for name, _ in ENGINE_TERMS), 0.0)
    for j, value in zip(kept, fit.coef, strict=True):
        coef[ENGINE_TERMS[j][0]] = value
    if coef["t0_s"] + coef["t1_s"] + coef["c_s"] <= 0:
        raise CalibrationError(f"{path}: the fit gives decode steps no cost (busy_s does not grow with them)")
    report = {
        "file": str(path),
        "intervals": len(deltas),
        "r2": fit.r2,
        "rmse_s": fit.rmse,
        "dropped": [
            f"{ENGINE_TERMS[j][0]} ({ENGINE_TERMS[j][1]} never moved or moved in proportion to the "
            "terms before it)"
            for j in dropped
        ],
        "clamped": [ENGINE_TERMS[j][0] for j, v in zip(kept, fit.coef, strict=True) if v == 0.0],
    }
    return EngineCosts(**coef), report


def fit_trainer(path: str | Path, workers: int = 1) -> tuple[TrainerCosts, float, dict[str, Any]]:
    """Trainer ``a``/``b`` and ``push_s`` from a metrics file, and the fit's report."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"{path}: no such file")
    steps: dict[int, tuple[float, float]] = {}
    pushes: list[float] = []
    for _, record in iter_jsonl(path, CalibrationError):
        if not isinstance(record, dict):
            continue
        train_s, tokens = record.get("runtime/train_s"), record.get("batch/tokens")
        if isinstance(train_s, (int, float)) and isinstance(tokens, (int, float)) and tokens > 0:
            steps[int(record.get("step", len(steps)))] = (float(tokens), float(train_s))  # a redone step wins
        push = record.get("runtime/weight_push_s")
        if isinstance(push, (int, float)) and push >= 0:
            pushes.append(float(push))
    if len(steps) < MIN_TRAINER_STEPS:
        raise CalibrationError(
            f"{path}: {len(steps)} trainer steps with runtime/train_s and batch/tokens; the trainer fit "
            f"needs at least {MIN_TRAINER_STEPS}"
        )
    tokens, train_s = zip(*steps.values(), strict=True)
    mean = sum(tokens) / len(tokens)
    spread = statistics.pstdev(tokens) / mean
    report: dict[str, Any] = {"file": str(path), "steps": len(steps), "pushes": len(pushes)}
    if spread < _CV_TOL:
        fit = nnls([list(tokens)], list(train_s))
        a, b = 0.0, fit.coef[0]
        report["dropped"] = [
            f"a_s (batch/tokens varies by {spread:.1e} of its mean: a and b not separable; "
            "fitted train_s = b·tokens)"
        ]
    else:
        fit = nnls([[1.0] * len(tokens), list(tokens)], list(train_s))
        a, b = fit.coef
        report["dropped"] = []
    report.update(r2=fit.r2, rmse_s=fit.rmse)
    push_s = statistics.median(pushes) if pushes else 0.0
    if not pushes:
        report["push"] = "no runtime/weight_push_s values: push_s = 0"
    return TrainerCosts(a_s=a, b_s=b, workers=workers), push_s, report


def _run_workers(run_dir: Path) -> int:
    """Trainer ranks of the run (``cluster.trainer_workers`` under the Ray runtime, else 1)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return 1
    data = yaml.safe_load(path.read_text()) or {}
    if (data.get("runtime") or {}).get("backend") != "ray":
        return 1
    return int((data.get("cluster") or {}).get("trainer_workers", 1))


def calibrate(run_dir: str | Path) -> StageCosts:
    """All stage constants of a run directory (module docstring); `CalibrationError` names what is missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CalibrationError(f"{run_dir}: not a directory")
    engine, engine_fit = fit_engine(run_dir / TIMELINE_FILE)
    trainer, push_s, trainer_fit = fit_trainer(run_dir / METRICS_FILE, _run_workers(run_dir))
    return StageCosts(
        engine,
        trainer,
        push_s,
        source=f"calibrated from {run_dir}",
        fit={"engine": engine_fit, "trainer": trainer_fit},
    )
