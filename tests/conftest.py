"""Session-wide tiny checkpoints (built once, seed 0, size "test") shared by model and training tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.models.tiny import tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE checkpoint directory (4 experts, top-2, ~0.16M parameters). Treat as read-only."""
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny_moe"), "qwen3_moe", "test", seed=0)


@pytest.fixture(scope="session")
def tiny_dense_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dense Qwen3 checkpoint directory (~0.16M parameters). Treat as read-only."""
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny_dense"), "qwen3", "test", seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_moe_dir: Path):
    """The local byte-level tokenizer with the Qwen-style chat template, as saved in the checkpoint."""
    from sao.models.loading import load_tokenizer

    return load_tokenizer(tiny_moe_dir)
