"""The weight checks of a run, from its ``metrics.jsonl``, for the report's "weight sync" panel.

Two series (`sao.runtime.weight_checks` logs them):

- the push probe: per pushed version, each replica's mean and max |Δ log-prob| against the trainer
  (``weight_sync/probe_mean_abs_diff/<replica>``, ``…/probe_max_abs_diff/<replica>``);
- the lag-0 mismatch: per step, mean |Δ log-prob| and the k3 KL estimate on the tokens sampled at the
  trainer's version (``mismatch/lag0_*``), and the drift ratio once it is defined.

The thresholds come from the run's ``config.yaml`` (absent: not shown). A step logged twice (a resumed run
redoing steps) counts once, its last record. The view is plain data: ``{"replicas", "probe", "mismatch",
"push_check", "mismatch_drift"}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["weight_checks_view"]

_MEAN, _MAX = "weight_sync/probe_mean_abs_diff/", "weight_sync/probe_max_abs_diff/"


def _records(path: Path) -> list[dict[str, Any]]:
    """The last record of each step in a metrics file (unreadable lines skipped)."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            by_step.setdefault(record["step"], {}).update(record)
    return [by_step[s] for s in sorted(by_step)]


def _settings(run_dir: Path) -> dict[str, Any]:
    try:
        import yaml

        runtime = (yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}).get("runtime")
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(runtime, dict):
        return {}
    keys = ("push_check", "mismatch_drift")
    return {key: runtime[key] for key in keys if isinstance(runtime.get(key), dict)}


def weight_checks_view(run_dir: str | Path) -> dict[str, Any] | None:
    """The panel's data for ``run_dir`` (module docstring), or None when its metrics hold neither series."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    probe, mismatch, replicas = [], [], set()
    for r in _records(metrics):
        means = {k[len(_MEAN) :]: v for k, v in r.items() if k.startswith(_MEAN)}
        if means:
            replicas.update(means)
            maxes = {k[len(_MAX) :]: v for k, v in r.items() if k.startswith(_MAX)}
            probe.append({"step": r["step"], "version": r.get("policy/version"), "mean": means, "max": maxes})
        if "mismatch/lag0_tokens" in r:
            mismatch.append({"step": r["step"], "tokens": r["mismatch/lag0_tokens"],
                             "abs_diff": r.get("mismatch/lag0_logprob_abs_diff"),
                             "k3": r.get("mismatch/lag0_k3_kl"),
                             "drift_ratio": r.get("mismatch/drift_ratio")})  # fmt: skip
    if not probe and not mismatch:
        return None
    return {"replicas": sorted(replicas, key=lambda n: (len(n), n)), "probe": probe, "mismatch": mismatch,
            **_settings(run_dir)}  # fmt: skip
