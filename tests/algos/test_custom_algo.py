"""A user's own loss and estimator, in a file of theirs, named in the config as
``{type: custom, path: my_algo.py:Class, ...its fields}``: validated at load (a typo, a missing or unknown
field, a bad path is refused naming the key), dumped and pickled as config, and trained with for real."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from sao.algos import AdvantageEstimator, PolicyLoss
from sao.config import ConfigError, dump_config, load_config

USER_FILE = '''
"""A user's algorithm file: a critic-free estimator and a loss."""
import torch

from sao.algos import AdvantageEstimator, AdvantageResult, LossOutput, PolicyLoss, aggregate, masked_mean


class ConstantAdvantage(AdvantageEstimator):
    """Every action token gets the same advantage ``bonus``."""

    bonus: float = 0.25

    def estimate(self, inputs, state):
        advantages = inputs.action_mask.float() * self.bonus
        return AdvantageResult(advantages, {"my_estimator/bonus": torch.tensor(self.bonus)})


class MyLoss(PolicyLoss):
    """``scale`` x the importance-weighted policy gradient surrogate against the rollout log-probs."""

    scale: float

    def __call__(self, inputs):
        mask = inputs.action_mask.bool()
        ratio = torch.exp(inputs.logprobs - inputs.reference)
        per_token = -ratio * inputs.advantages
        loss = self.scale * aggregate(per_token, mask, self.agg, inputs.cu_seqlens, inputs.denominator)
        metrics = {
            "my_loss/scale": torch.tensor(self.scale),
            "my_loss/adv_mean": masked_mean(inputs.advantages.detach(), mask),
        }
        return LossOutput(loss, metrics)


class NotALoss:
    scale: float = 1.0
'''

TINY = ["model.tiny_arch=qwen3_moe"]


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_algo.py"
    path.write_text(USER_FILE)
    return path


def _loss(path: Path, cls: str = "MyLoss", extra: str = ", scale: 0.5") -> str:
    return f"algo.loss={{type: custom, path: {path}:{cls}{extra}}}"


def _estimator(path: Path, extra: str = "") -> str:
    return f"algo.advantage={{type: custom, path: {path}:ConstantAdvantage{extra}}}"


def _refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(None, [*TINY, *overrides])
    return str(err.value)


# ---- validated at load -----------------------------------------------------------------------------------


def test_load_config_accepts_a_custom_loss_and_estimator_and_builds_the_users_objects(user_file):
    cfg = load_config(None, [*TINY, "algo=spo", _loss(user_file), _estimator(user_file)])
    loss, est = cfg.algo.loss.build(), cfg.algo.advantage.build()
    assert isinstance(loss, PolicyLoss) and type(loss).__name__ == "MyLoss" and loss.scale == 0.5
    assert isinstance(est, AdvantageEstimator) and type(est).__name__ == "ConstantAdvantage"
    assert est.bonus == 0.25  # the field's default
    assert not cfg.algo.uses_critic
    cfg = load_config(None, [*TINY, "algo=spo", _estimator(user_file, ", bonus: 0.375")])
    assert cfg.algo.advantage.build().bonus == 0.375


def test_a_typo_in_type_is_refused_naming_the_type_key(user_file):
    message = _refused(f"algo.loss={{type: custm, path: {user_file}:MyLoss, scale: 0.5}}")
    assert "algo.loss.type" in message and "custom" in message  # the allowed types are listed


def test_a_missing_field_of_the_users_class_is_refused_naming_the_section_and_field(user_file):
    message = _refused(_loss(user_file, extra=""))
    assert "algo.loss.scale: Field required (MyLoss from " in message


def test_an_unknown_field_of_the_users_class_is_refused_naming_it(user_file):
    message = _refused(_loss(user_file, extra=", scale: 0.5, scael: 1.0"))
    assert "algo.loss.scael: Extra inputs are not permitted" in message
    message = _refused(_estimator(user_file, ", bonsu: 1.0"))
    assert "algo.advantage.bonsu: Extra inputs are not permitted" in message


def test_a_bad_value_for_a_field_of_the_users_class_is_refused(user_file):
    message = _refused(_loss(user_file, extra=", scale: lots"))
    assert "algo.loss.scale: Input should be a valid number" in message


@pytest.mark.parametrize(
    ("where", "expect"),
    [("missing_file", "does not exist"), ("missing_class", "has no attribute"), ("not_a_loss", "subclass")],
)
def test_a_path_that_does_not_name_a_policy_loss_is_refused_naming_algo_loss(user_file, where, expect):
    path, cls = {
        "missing_file": (user_file.with_name("nowhere.py"), "MyLoss"),
        "missing_class": (user_file, "MyLos"),
        "not_a_loss": (user_file, "NotALoss"),
    }[where]
    message = _refused(_loss(path, cls))
    assert "algo.loss" in message and expect in message


def test_an_estimator_is_not_accepted_as_a_loss(user_file):
    message = _refused(_loss(user_file, "ConstantAdvantage", extra=""))
    assert "algo.loss" in message and "PolicyLoss" in message


def test_dump_config_round_trips_the_custom_sections(user_file, tmp_path):
    cfg = load_config(None, [*TINY, "algo=spo", _loss(user_file), _estimator(user_file, ", bonus: 0.375")])
    text = dump_config(cfg)
    assert "MyLoss" in text and "scale: 0.5" in text and "bonus: 0.375" in text
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(text)
    again = load_config(dumped)
    assert again == cfg
    assert again.algo.loss.build().scale == 0.5 and again.algo.advantage.build().bonus == 0.375


def test_pickle_round_trips_the_config_with_the_users_objects(user_file):
    cfg = load_config(None, [*TINY, "algo=spo", _loss(user_file), _estimator(user_file, ", bonus: 0.375")])
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg
    assert type(again.algo.loss.build()).__name__ == "MyLoss" and again.algo.loss.build().scale == 0.5
    assert again.algo.advantage.build().bonus == 0.375


# ---- trained with ------------------------------------------------------------------------------------------

# The smallest real run (tests/runtime/test_runner.py): the tiny MoE model on the calculator env, no critic.
_RUN = [
    "model.tiny_arch=qwen3_moe", "model.tiny_size=test", "model.dtype=float32", "model.device=cpu",
    "engine.max_new_tokens=16", "engine.max_concurrent=8",
    "data.env=calculator", "data.max_turns=3", "data.max_total_tokens=200",
    "trainer.lr=1e-3", "trainer.batch_size=4", "trainer.total_steps=2",
    "runtime.max_in_flight=8", "runtime.max_staleness=1",
    "logging.tensorboard=false", "logging.checkpoint_every=2",
    "algo=spo", "critic.pretrain.enabled=false",
]  # fmt: skip


def test_a_short_run_trains_with_the_custom_loss_and_estimator(user_file, tmp_path):
    from sao.runtime.runner import train_sync_entry  # here: the load-time tests above need no runtime

    run_dir = tmp_path / "run"
    cfg = load_config(
        None, [*_RUN, f"logging.run_dir={run_dir}", _loss(user_file), _estimator(user_file, ", bonus: 0.375")]
    )
    result = train_sync_entry(cfg)
    assert (result.steps, result.policy_version) == (2, 2)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["my_loss/scale"] == pytest.approx(0.5)  # the user's loss ran, with its field
        assert r["my_estimator/bonus"] == pytest.approx(0.375)  # the user's estimator ran
        # the advantages the loss received are the estimator's: 0.375 on every action token
        assert r["my_loss/adv_mean"] == pytest.approx(0.375)
        assert r["adv/mean"] == pytest.approx(0.375) and r["adv/std"] == pytest.approx(0.0, abs=1e-7)
