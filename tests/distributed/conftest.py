"""The FSDP scenarios on 2 gloo ranks, run once per session and shared by the tests that read them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import fsdp_scenarios as scenarios


@dataclass(frozen=True)
class FsdpRuns:
    """``ranks``: rank 0's results of every scenario; ``batches``: what they trained on; ``work``: their
    directory (``work/ckpt``: the checkpoint the ``sao`` scenario saved after step 1)."""

    model_dir: Path
    work: Path
    batches: dict[str, Any]
    ranks: dict[str, Any]


@pytest.fixture(scope="session")
def fsdp_runs(tiny_moe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> FsdpRuns:
    work = tmp_path_factory.mktemp("fsdp")
    batches = scenarios.make_batches(tiny_moe_dir)
    return FsdpRuns(tiny_moe_dir, work, batches, scenarios.run_ranks(tiny_moe_dir, work, batches))
