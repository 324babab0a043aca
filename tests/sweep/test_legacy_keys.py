"""Run keys survive the typed algo section: a config gives the key it had when ``algo`` was flat (the keys
below were computed with the flat section, before the change), so finished sweep runs stay found."""

from __future__ import annotations

import pytest

from sao.config import load_config
from sao.sweep.spec import run_key

FLAT_KEYS = [
    ([], "71289f4c85f2"),
    (["algo=grpo"], "330916eaf0ec"),
    (["algo=running_mean_128", "algo.loss.eps_low=0.25"], "1d445e1bf4c2"),
    (["algo=spo", "algo.advantage.d_half=0.1", "trainer.lr=1e-4"], "86e8251fab25"),
    (["algo=vapo"], "7c5cfa61431c"),
    (["algo=step_last_token", "algo.advantage.truncation=bootstrap"], "45a6c5da838b"),
]


@pytest.mark.parametrize(("overrides", "key"), FLAT_KEYS)
def test_a_config_keeps_the_run_key_of_its_flat_spelling(overrides, key):
    assert run_key(load_config(None, ["model.tiny_arch=qwen3_moe", *overrides])) == key


def test_a_custom_loss_gets_a_key_of_its_own(tmp_path):
    (tmp_path / "algo.py").write_text(
        "from sao.algos import PolicyLoss\n\nclass Mine(PolicyLoss):\n    scale: float = 1.0\n"
    )
    base = ["model.tiny_arch=qwen3_moe", f"algo.loss={{type: custom, path: {tmp_path}/algo.py:Mine}}"]
    one, two = (run_key(load_config(None, [*base, f"algo.loss.scale={s}"])) for s in (1.0, 2.0))
    assert one != two and one not in {k for _, k in FLAT_KEYS}
