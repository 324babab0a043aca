"""Metric sinks: where ``(step, {name: value})`` records go.

Every sink satisfies the small :class:`MetricsSink` protocol (``log(step, metrics)``, ``close()``):

- :class:`JsonlMetricsSink` appends one JSON object per logged step to ``RUN_DIR/metrics.jsonl``
  (``sao plot`` reads it back);
- :class:`TensorBoardSink` writes scalar events into ``RUN_DIR`` (``tensorboard --logdir runs/``);
- :class:`WandbSink` forwards to Weights & Biases, only when ``wandb`` is installed and enabled; its run
  id is kept in ``RUN_DIR/wandb_run_id`` so that a resumed run continues the same W&B run;
- :class:`MultiSink` fans one record out to several sinks; :func:`make_sinks` builds it from a
  :class:`~sao.config.LoggingConfig`.

On resume from the checkpoint of step ``s`` (``make_sinks(..., resume_step=s)``) the steps after ``s``
that a killed run had logged are redone, so :func:`rewind_metrics` moves their JSONL lines to
``RUN_DIR/metrics.discarded.jsonl`` (kept, not deleted) and TensorBoard purges its events after ``s``.

Values may be Python numbers, bools, or one-element tensors/NumPy scalars; anything else (strings, lists,
multi-element tensors) is skipped, never an error. Non-finite values: JSONL writes NaN as ``null`` and
±inf as ±1e308 (JSON has no infinities); TensorBoard and W&B receive them as they are.

Module import stays light (no torch): the TensorBoard writer and ``wandb`` are imported when a sink is
built.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sao.config import ConfigError

if TYPE_CHECKING:
    from sao.config import LoggingConfig

__all__ = [
    "DISCARDED_METRICS_FILE",
    "METRICS_FILE",
    "WANDB_RUN_ID_FILE",
    "JsonlMetricsSink",
    "MetricsSink",
    "MultiSink",
    "TensorBoardSink",
    "WandbSink",
    "json_number",
    "make_sinks",
    "rewind_metrics",
    "scalar_metrics",
    "scalar_value",
]

METRICS_FILE = "metrics.jsonl"
DISCARDED_METRICS_FILE = "metrics.discarded.jsonl"
WANDB_RUN_ID_FILE = "wandb_run_id"


@runtime_checkable
class MetricsSink(Protocol):
    """Anything that takes ``(step, {name: value})`` records and can be closed."""

    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalar_value(value: Any) -> int | float | None:
    """``value`` as a Python int/float, or None when it is not a scalar (it is then skipped)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    # Tensors and NumPy scalars/arrays, duck-typed so that this module does not import torch.
    numel = getattr(value, "numel", None)
    size = numel() if callable(numel) else getattr(value, "size", None)
    item = getattr(value, "item", None)
    if size == 1 and callable(item):
        plain = item()
        if isinstance(plain, (bool, int, float)):
            return scalar_value(plain)
    return None


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, int | float]:
    """The scalar entries of ``metrics`` as plain numbers; non-scalars dropped."""
    out: dict[str, int | float] = {}
    for name, value in metrics.items():
        plain = scalar_value(value)
        if plain is not None:
            out[name] = plain
    return out


def json_number(value: int | float) -> int | float | None:
    """``value`` as JSON can hold it: NaN as None (``null``), ±inf as ±1e308, others unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


class JsonlMetricsSink:
    """Appends ``{"step": s, "time": t, **metrics}`` lines to a JSONL file (flushed per line)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        values = {k: json_number(v) for k, v in scalar_metrics(metrics).items()}
        record = {"step": step, "time": time.time(), **values}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlMetricsSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBoardSink:
    """Scalar events in ``run_dir`` (one TensorBoard run per run directory); flushed every log."""

    def __init__(self, run_dir: str | Path, purge_step: int | None = None) -> None:
        """``purge_step``: drop the events at steps >= it that earlier writers left (a resumed run)."""
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(log_dir=str(self.run_dir), purge_step=purge_step)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for name, value in scalar_metrics(metrics).items():
            self._writer.add_scalar(name, float(value), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Weights & Biases run; ``project`` defaults to ``$WANDB_PROJECT`` or ``sao``.

    ``config`` (the resolved run config, plain data) goes to ``wandb.init(config=...)``. The W&B run id is
    kept in ``run_dir/wandb_run_id`` (`WANDB_RUN_ID_FILE`, written atomically): a new run (``resume_step``
    None) generates a fresh id and (over)writes the file; a resumed run (``resume_step`` set) reads it and
    inits with ``id=<that id>, resume="allow"``, so it continues the same W&B run (a fresh id, written to
    the file, when there is none: the earlier run did not log to W&B). ``id=`` is always passed, so the
    file and W&B agree.

    Steps stay those of the run (``log(step=...)``). W&B refuses a step lower than or equal to the last one
    it has: a run killed after its checkpoint of step ``s`` had logged steps past ``s``, and their redone
    records (steps ``s+1`` up to the last one W&B saw) are dropped by W&B with a warning. W&B's history is
    not rewound; ``metrics.jsonl`` and TensorBoard hold the redone values.

    Raises :class:`~sao.config.ConfigError` (naming ``logging.wandb``) when ``wandb`` is not installed.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        run_name: str | None = None,
        project: str | None = None,
        config: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
    ) -> None:
        try:
            wandb = importlib.import_module("wandb")
        except ImportError:
            raise ConfigError(
                "logging.wandb: true, but the 'wandb' package is not installed "
                "(pip install wandb, or set logging.wandb=false)"
            ) from None
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        id_file = run_dir / WANDB_RUN_ID_FILE
        run_id = None
        if resume_step is not None and id_file.exists():
            run_id = id_file.read_text(encoding="utf-8").strip() or None
        resume = "allow" if run_id is not None else None
        if run_id is None:
            run_id = _new_wandb_id(wandb)
        self.run_id = run_id
        self.resume_step = resume_step
        kwargs: dict[str, Any] = {
            "project": project or os.environ.get("WANDB_PROJECT", "sao"),
            "name": run_name or run_dir.name,
            "dir": str(run_dir),
            "config": dict(config) if config is not None else None,
            "id": run_id,
        }
        if resume is not None:
            kwargs["resume"] = resume
        self._run = wandb.init(**kwargs)
        if resume is None:  # a new W&B run: record its id for a later --resume
            tmp = id_file.with_name(id_file.name + ".tmp")
            tmp.write_text(run_id + "\n", encoding="utf-8")
            os.replace(tmp, id_file)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self._run.log(scalar_metrics(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def _new_wandb_id(wandb: Any) -> str:
    generate = getattr(getattr(wandb, "util", None), "generate_id", None)
    return str(generate()) if callable(generate) else uuid.uuid4().hex[:8]


class MultiSink:
    """Fans each record out to ``sinks``; logs only steps that are multiples of ``every``.

    ``close()`` closes every sink even when one fails, then re-raises the first failure.
    """

    def __init__(self, sinks: Sequence[MetricsSink], every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.sinks: tuple[MetricsSink, ...] = tuple(sinks)
        self.every = every

    def log(self, step: int, metrics: Mapping[str, Any], *, always: bool = False) -> None:
        """Forward ``metrics`` of ``step`` when ``step`` is a multiple of ``every`` (or ``always``: records
        that happen once, e.g. an evaluation, are not thinned out)."""
        if step % self.every and not always:
            return
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        first: BaseException | None = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as err:
                first = first or err
        if first is not None:
            raise first

    def __enter__(self) -> MultiSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_sinks(
    logging_cfg: LoggingConfig,
    run_dir: str | Path,
    *,
    run_name: str | None = None,
    config: Mapping[str, Any] | None = None,
    resume_step: int | None = None,
) -> MultiSink:
    """JSONL always (``run_dir/metrics.jsonl``), TensorBoard and W&B as ``logging_cfg`` enables them;
    records are kept every ``logging_cfg.log_every`` steps. ``config`` (the resolved run config) goes to W&B.
    ``resume_step``: the run resumes after this step; later records of the earlier run are set aside, and
    W&B continues the run whose id ``run_dir/wandb_run_id`` holds (see :class:`WandbSink`).
    """
    run_dir = Path(run_dir)
    sinks: list[MetricsSink] = []
    try:
        if logging_cfg.wandb:  # first: the one most likely to fail, before files are opened
            sinks.append(WandbSink(run_dir, run_name=run_name, config=config, resume_step=resume_step))
        if resume_step is not None:
            rewind_metrics(run_dir / METRICS_FILE, resume_step)
        sinks.append(JsonlMetricsSink(run_dir / METRICS_FILE))
        if logging_cfg.tensorboard:
            purge = None if resume_step is None else resume_step + 1
            sinks.append(TensorBoardSink(run_dir, purge_step=purge))
    except BaseException:
        MultiSink(sinks).close()
        raise
    return MultiSink(sinks, every=logging_cfg.log_every)


def rewind_metrics(path: str | Path, step: int, discarded: str = DISCARDED_METRICS_FILE) -> int:
    """Keep the records of ``path`` (a JSONL of records with a ``step``) up to ``step``; move later ones,
    and unreadable lines, to ``discarded`` beside it (appended). Returns how many lines moved."""
    path = Path(path)
    if not path.exists():
        return 0
    keep: list[str] = []
    moved: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record_step = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):  # a line cut by the kill, or not a record
            record_step = None
        (keep if record_step is not None and record_step <= step else moved).append(line)
    if moved:
        with (path.parent / discarded).open("a", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in moved)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
        os.replace(tmp, path)
    return len(moved)
