"""Small pieces shared by the training loops: data splits, batching, seeding, atomic saves (lr schedules:
`sao.train.step_schedule`)."""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = ["atomic_dir", "batches_forever", "ready_for_training", "set_seed", "split_eval"]

T = TypeVar("T")
M = TypeVar("M", bound=nn.Module)


def split_eval(items: Sequence[T], eval_frac: float, seed: int) -> tuple[list[T], list[T]]:
    """Seeded shuffle, then ``(train, eval)`` with ``round(eval_frac·n)`` eval items (at least one train)."""
    if not 0.0 <= eval_frac < 1.0:
        raise ValueError(f"eval_frac must lie in [0, 1), got {eval_frac}")
    order = list(items)
    random.Random(seed).shuffle(order)
    n_eval = min(round(eval_frac * len(order)), len(order) - 1)
    return order[n_eval:], order[:n_eval]


def batches_forever(items: Sequence[T], batch_size: int, seed: int) -> Iterator[list[T]]:
    """Endless epochs over ``items`` in a fresh seeded order each epoch, ``batch_size`` at a time."""
    rng = random.Random(seed)
    order = list(items)
    while True:
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            yield order[start : start + batch_size]


@contextmanager
def atomic_dir(out_dir: str | Path) -> Iterator[Path]:
    """Build a directory atomically: yields a sibling staging dir, renamed over ``out_dir`` on success.

    On an exception the staging dir is removed and ``out_dir`` is left as it was.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        old.rmdir()
        out.rename(old)
        stage.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        stage.rename(out)


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def ready_for_training(model: M, compute: Any) -> M:
    """A loaded model (weights in the master dtype) made ready for one-process training, in place:
    ``compute``'s attention kernel and activation checkpointing (`sao.models.prepare.prepare_for_training`),
    and forward/backward in the compute dtype while weights, gradients and AdamW state stay in the master
    dtype (`sao.models.precision.cast_for_compute`). ``compute``: ``dtype``, ``master_dtype``, ``device``,
    ``attn_implementation``, ``gradient_checkpointing`` (`sao.models.prepare.ComputeSettings`)."""
    from sao.models.loading import resolve_device
    from sao.models.precision import Precision, cast_for_compute
    from sao.models.prepare import prepare_for_training

    prepare_for_training(model, compute)
    precision = Precision.resolve(compute.dtype, compute.master_dtype, resolve_device(compute.device))
    if precision.mixed:
        cast_for_compute(model, precision.compute)
    return model
