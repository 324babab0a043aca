"""What `sao inspect` can open, read into one view document: ``{"title", "source", "kind", "meta",
"trajectories": [record, …]}`` (records: `sao.inspector.records`).

* a run directory with kept trajectories (``RUN_DIR/inspect/``, ``logging.inspect_every``): kind "train",
  with the run's weight checks (push probe, lag-0 mismatch: `sao.inspector.checks`) as ``weight_checks``
  when its metrics hold them (a run directory with those checks and no kept trajectories opens too);
* a JSONL file of trajectories (`sao serve --out`, `sao.types.save_jsonl`): kind "trajectory";
* an evaluation report with transcripts (`sao eval --transcripts --out`): kind "eval", one record per
  sample.

Token texts of a run's files were decoded by the run; the other two need a tokenizer: ``tokenizer`` (a
directory or name `transformers.AutoTokenizer` loads offline), else the report's ``settings.model``.
A line or sample that cannot be read becomes an entry of ``skipped`` with the reason, not a failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sao.types import Trajectory, TrajectoryError

from .checks import weight_checks_view
from .records import trajectory_record
from .store import INSPECT_DIR, read_step_files

__all__ = ["InspectSourceError", "load_source"]


class InspectSourceError(ValueError):
    """The path is none of the sources `load_source` reads, or it lacks what the view needs."""


def _load_tokenizer(name: str | os.PathLike[str] | None, why: str) -> Any:
    if name is None:
        raise InspectSourceError(f"{why}: pass --tokenizer (the model or tokenizer directory) to decode them")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(name), local_files_only=True)
    except (OSError, ValueError) as err:
        raise InspectSourceError(f"--tokenizer {name}: cannot load a tokenizer ({err})") from None


def _run_dir(path: Path, step: int | None) -> dict[str, Any]:
    checks = weight_checks_view(path)
    if not (path / INSPECT_DIR).is_dir():
        if checks is not None and step is None:  # the weight checks alone
            return {"title": f"{path.name}: weight sync checks (no kept trajectories)", "kind": "train",
                    "meta": {"name": path.name}, "trajectories": [], "skipped": [],
                    "weight_checks": checks}  # fmt: skip
        raise InspectSourceError(
            f"{path}: no kept trajectories in {path / INSPECT_DIR} (train with logging.inspect_every=N)"
        )
    try:
        docs = read_step_files(path, step)
    except (FileNotFoundError, ValueError) as err:
        raise InspectSourceError(str(err)) from None
    meta = dict(docs[-1].get("meta") or {})
    trajectories = [t for doc in docs for t in doc["trajectories"]]
    name = meta.get("name") or path.name
    doc = {"title": f"{name}: {len(trajectories)} kept trajectories of {len(docs)} steps", "kind": "train",
           "meta": meta, "trajectories": trajectories, "skipped": []}  # fmt: skip
    if checks is not None:
        doc["weight_checks"] = checks
    return doc


def _jsonl(path: Path, tokenizer: Any) -> dict[str, Any]:
    lines = path.read_text(encoding="utf-8").splitlines()
    records, skipped = [], []
    tok = None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            traj = Trajectory.from_dict(json.loads(line))
            traj.validate()
        except (ValueError, TrajectoryError) as err:
            skipped.append(f"line {n}: {err}")
            continue
        if tok is None:
            tok = _load_tokenizer(tokenizer, f"{path} holds token ids")
        records.append(trajectory_record(traj, tok, session_id=traj.metadata.get("session_id")))
    if not records:
        raise InspectSourceError(
            f"{path}: no readable trajectory ({skipped[0] if skipped else 'empty file'})"
        )
    return {"title": f"{path.name}: {len(records)} trajectories", "kind": "trajectory", "meta": {},
            "trajectories": records, "skipped": skipped}  # fmt: skip


def _eval_report(path: Path, report: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    settings = report.get("settings") or {}
    records, skipped = [], []
    tok = None
    for task in report.get("tasks") or []:
        for sample in task.get("samples") or []:
            where = f"task {task.get('id')!r} sample {sample.get('sample')}"
            extra = {"task": task.get("id"), "file": task.get("file"), "sample": sample.get("sample"),
                     "success": sample.get("success"), "error": sample.get("error")}  # fmt: skip
            data = sample.get("trajectory")
            if data is None:
                why = "no tokens (the report was written without --transcripts)"
                skipped.append(f"{where}: {sample.get('error') or why}")
                continue
            try:
                traj = Trajectory.from_dict({**data, "metadata": {}})
                traj.validate()
            except (ValueError, TrajectoryError) as err:
                skipped.append(f"{where}: {err}")
                continue
            if tok is None:
                tok = _load_tokenizer(tokenizer or settings.get("model"), f"{path} holds token ids")
            records.append(trajectory_record(traj, tok, kind="eval", **extra))
    if not records:
        first = skipped[0] if skipped else "no samples"
        raise InspectSourceError(f"{path}: no sample with tokens to show ({first}); rerun with --transcripts")
    meta = {"model": settings.get("model"), "k": report.get("k")}
    return {"title": f"{path.name}: {len(records)} evaluation samples", "kind": "eval", "meta": meta,
            "trajectories": records, "skipped": skipped}  # fmt: skip


def load_source(
    path: str | os.PathLike[str], *, step: int | None = None, tokenizer: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """The view document of ``path`` (module docstring); ``step``: only that kept step of a run.
    Raises `InspectSourceError` with the reason when ``path`` is none of the sources."""
    p = Path(path)
    if not p.exists():
        raise InspectSourceError(f"{p}: no such file or directory")
    if p.is_dir():
        doc = _run_dir(p, step)
    elif step is not None:
        raise InspectSourceError(f"--step applies to a run directory, not to {p}")
    else:
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise InspectSourceError(f"{p}: cannot read it ({err})") from None
        try:
            whole = json.loads(text)
        except ValueError:
            whole = None
        if isinstance(whole, dict) and "tasks" in whole:
            doc = _eval_report(p, whole, tokenizer)
        elif (isinstance(whole, dict) and "token_ids" in whole) or whole is None:
            doc = _jsonl(p, tokenizer)
        else:
            raise InspectSourceError(
                f"{p}: neither trajectories (JSONL) nor an evaluation report (JSON with 'tasks')"
            )
    doc["source"] = str(p)
    return doc
