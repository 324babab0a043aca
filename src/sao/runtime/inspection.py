"""Kept trajectories of a run (``logging.inspect_every``): the step observer behind `sao inspect`.

Every ``inspect_every`` steps the run asks the trainer to capture the step (`Trainer.train_step(...,
capture=True)`: per-token copies of what it computed, no extra forward); after the step this observer picks
``inspect_samples`` of the batch's trajectories (a random choice seeded by the run seed and the step, so a
rerun keeps the same ones), turns them into records (`sao.inspector.records`) and writes the step's file
(`sao.inspector.store`: bounded by ``inspect_max_mb``). The seconds it took go to ``runtime/inspect_s``.
A resumed run deletes the files of the steps after its checkpoint (it trains them again).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from sao.inspector.records import train_records
from sao.inspector.store import InspectStore

from .args import InspectArgs
from .observers import StepRecord

__all__ = ["TrajectoryInspector", "pick_samples"]


def pick_samples(num: int, samples: int, seed: int, step: int) -> list[int]:
    """Sorted indices of ``min(samples, num)`` of a batch's ``num`` trajectories, seeded by run and step."""
    rng = random.Random(seed * 1_000_003 + step)
    return sorted(rng.sample(range(num), min(samples, num)))


class TrajectoryInspector:
    """See the module docstring; ``trainer`` is the run's `Trainer` (or `TrainerGroup`)."""

    def __init__(
        self, args: InspectArgs, trainer: Any, tokenizer: Any, resume_step: int | None = None
    ) -> None:
        self.args, self.trainer, self.tokenizer = args, trainer, tokenizer
        self.store = InspectStore(args.run_dir, args.max_bytes, args.meta)
        if resume_step is not None:  # the steps after the checkpoint (-1: none) are trained again
            self.store.rewind(max(resume_step, 0))

    @property
    def enabled(self) -> bool:
        return self.args.every is not None

    def wants(self, step: int) -> bool:
        """Whether trainer step ``step`` (1-based: the step about to be trained) is to be captured."""
        return self.args.every is not None and step % self.args.every == 0

    async def on_step(self, record: StepRecord) -> None:
        capture = getattr(self.trainer, "last_capture", None)
        if capture is None or capture.step != record.step:
            return
        t0 = time.monotonic()
        indices = pick_samples(record.batch.num_sequences, self.args.samples, self.args.seed, record.step)
        batch = record.batch

        def write() -> None:
            records = train_records(batch, capture, record.trajectories, indices, self.tokenizer)
            self.store.write(record.step, records)

        await asyncio.to_thread(write)
        self.trainer.last_capture = None
        record.metrics["runtime/inspect_s"] = time.monotonic() - t0
