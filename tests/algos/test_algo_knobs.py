"""Every algorithm key is read: for each built-in class of ``algo.advantage`` and ``algo.loss`` and each of
its fields, changing the field to another valid value changes what the component computes.

The classes and fields are walked from the schema (`union_variants`, ``model_fields``), so a class or a
field added later is covered without editing this file, and fails here if nothing reads it. The changed
value is derived from the field's annotation (a Literal's other choice, a bool's negation, a number inside
the field's bounds that the model accepts); `SPECIAL` holds the few that cannot be derived.

The inputs are fixed and built so that every knob matters: observation tokens (adaptive length, token vs
skip-observation GAE), several turns with unequal token values (step values), truncated trajectories with a
non-zero value at their last action token (truncation), groups and prompts with unequal rewards over three
batches (GRPO's std, running-mean window and scope), SPO divergences below, inside and above the clamps of
ρ (d_half, rho_min, rho_max); ratios below, inside and above every band, trajectories of different lengths
(agg) and positive trajectories (nll_coef).
"""

from __future__ import annotations

import itertools
import math
import typing
from typing import Any, Literal

import annotated_types
import pytest
import torch
from pydantic import BaseModel, ValidationError

from sao.algos import AdvantageEstimator, AdvantageInputs, LossInputs, PolicyLoss
from sao.config.algo import AlgoConfig
from sao.config.unions import union_variants

F64 = torch.float64

# Fields whose changed value cannot be derived from the annotation alone.
SPECIAL: dict[str, Any] = {"lam_policy": 0.5}  # 'adaptive' | float in [0, 1]: take the fixed-λ branch


def _cases(section: str) -> list[tuple[str, type[BaseModel], str]]:
    variants = union_variants(AlgoConfig, section)
    assert variants, f"algo.{section} is not a union chosen by type"
    return [
        (tag, cls, field)
        for tag, cls in variants.items()
        if tag != "custom"
        for field in cls.model_fields
        if field != "type"
    ]


def _bound(info: Any, kind: type, attr: str) -> float | None:
    for meta in info.metadata:
        if isinstance(meta, kind):
            return float(getattr(meta, attr))
    return None


def _candidates(cls: type[BaseModel], field: str, default: Any) -> list[Any]:
    info = cls.model_fields[field]
    annotation = info.annotation
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    if annotation is bool:
        return [not default]
    if annotation is int:  # the lowest valid int first (a window of 1), then others near the default
        low = _bound(info, annotated_types.Ge, "ge")
        gt = _bound(info, annotated_types.Gt, "gt")
        low = low if low is not None else (math.floor(gt) + 1 if gt is not None else default - 1)
        return [int(low), default // 2, default * 2, default + 1]
    if annotation is float:  # the model rejects a candidate outside ge/gt/le/lt (or a cross-field rule)
        high = _bound(info, annotated_types.Le, "le")
        high = _bound(info, annotated_types.Lt, "lt") if high is None else high
        middle = [(default + high) / 2] if high is not None else []
        return [default / 2, *middle, default * 2, default + 1.0]
    raise TypeError(
        f"cannot derive another value for {cls.__name__}.{field} ({annotation}): add one to SPECIAL in "
        f"{__file__}"
    )


def _changed(cls: type[BaseModel], field: str) -> tuple[Any, Any]:
    """``(default, another valid value)`` of ``cls.field``."""
    default = cls.model_fields[field].get_default(call_default_factory=True)
    candidates = [SPECIAL[field]] if field in SPECIAL else _candidates(cls, field, default)
    for value in candidates:
        if value == default:
            continue
        try:
            cls(**{field: value})
        except ValidationError:
            continue
        return default, value
    raise AssertionError(
        f"no valid value other than {default!r} for {cls.__name__}.{field} among {candidates}: add one to "
        "SPECIAL"
    )


# ---- fixed inputs --------------------------------------------------------------------------------------

# Six trajectories (P prompt, a action, O observation), two per prompt and per group; 3 and 5 truncated.
LAYOUTS = ["PPaaOOaa", "Paaa", "PaOaaOOa", "PaaOaa", "PPaaaOa", "PaOOaaa"]
PROMPTS = ["p0", "p0", "p1", "p1", "p2", "p2"]
GROUPS = [0, 0, 1, 1, 2, 2]
TRUNCATED = torch.tensor([False, False, False, True, False, True])
DIVERGENCE = torch.tensor([0.0, 0.005, 1.0, 0.008, 0.002, 0.5])  # ρ: rho_max, inside, rho_min, ...
OUTCOMES = [  # per batch; unequal inside every group and every prompt, in [0, 1] (SPO)
    [1.0, 0.0, 0.5, 1.0, 0.0, 0.25],
    [0.0, 1.0, 1.0, 0.5, 0.75, 0.0],
    [1.0, 0.5, 0.0, 1.0, 0.25, 1.0],
]
SAMPLED = ["p0", "p1", "p2", "p3"]  # the prompts sampling weights are asked for (p3 never seen)


def _estimator_batch(outcomes: list[float]) -> AdvantageInputs:
    tokens = "".join(LAYOUTS)
    mask = torch.tensor([c == "a" for c in tokens])
    lengths = torch.tensor([len(x) for x in LAYOUTS])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    rewards = torch.zeros(len(tokens), dtype=F64)
    turn_ids = torch.zeros(len(tokens), dtype=torch.long)
    for b, layout in enumerate(LAYOUTS):
        start = int(cu[b])
        rewards[start + layout.rindex("a")] = outcomes[b]
        turns = [0]
        for prev, cur in itertools.pairwise(layout):
            turns.append(turns[-1] + (prev == "O" and cur == "a"))
        turn_ids[start : start + len(layout)] = torch.tensor(turns)
    turn_ids[cu[1] + 3] += 1  # trajectory 1: two back-to-back turns with no observation between
    values = torch.tensor([0.05 + ((7 * i) % 11) / 10 for i in range(len(tokens))], dtype=F64)
    return AdvantageInputs(
        token_rewards=rewards,
        action_mask=mask,
        cu_seqlens=cu,
        values=values,
        prompt_ids=PROMPTS,
        group_ids=GROUPS,
        divergence=DIVERGENCE,
        turn_ids=turn_ids,
        truncated=TRUNCATED,
    )


def _loss_inputs() -> LossInputs:
    """120 action tokens: 60 ratios from 0.05 to 20 (geometric steps of ~11%), each once with a positive and
    once with a negative advantage, shuffled into four trajectories of 10, 25, 40 and 45 action tokens (each
    after two prompt tokens); trajectories 0 and 2 are positive."""
    log_ratio = torch.linspace(math.log(0.05), math.log(20.0), 60, dtype=F64).repeat_interleave(2)
    advantage = torch.tensor([1.3, -0.7], dtype=F64).repeat(60)
    order = torch.randperm(120, generator=torch.Generator().manual_seed(0))
    log_ratio, advantage = log_ratio[order], advantage[order]
    sizes, prompt = [10, 25, 40, 45], 2
    n = 120 + prompt * len(sizes)
    mask = torch.zeros(n, dtype=torch.bool)
    positive = torch.zeros(n, dtype=torch.bool)
    cu, start = [0], 0
    for b, size in enumerate(sizes):
        mask[start + prompt : start + prompt + size] = True
        positive[start : start + prompt + size] = b in (0, 2)
        start += prompt + size
        cu.append(start)
    logprobs = -0.2 - 0.01 * torch.arange(n, dtype=F64)
    reference = logprobs.clone()
    reference[mask] = logprobs[mask] - log_ratio
    adv = torch.zeros(n, dtype=F64)
    adv[mask] = advantage
    return LossInputs(
        logprobs=logprobs.requires_grad_(True),
        reference=reference,
        advantages=adv,
        action_mask=mask,
        cu_seqlens=torch.tensor(cu),
        positive=positive,
    )


# ---- what a component computes ------------------------------------------------------------------------


def _finite(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        assert bool(x.isfinite().all()), "the fixed inputs gave a non-finite output"
    return x


def _estimator_outputs(est: AdvantageEstimator) -> list[Any]:
    """Advantages (and metrics) of three consecutive batches with the state updated between them, the
    critic targets of a critic estimator, and the prompt sampling weights after each batch."""
    state = est.make_state()
    out: list[Any] = []
    for outcomes in OUTCOMES:
        batch = _estimator_batch(outcomes)
        result = est.advantages(batch, state)
        names = sorted(result.metrics)
        out += [result.advantages, names, *(result.metrics[k] for k in names)]
        if est.uses_critic:
            targets = est.targets(batch)
            out += [targets.returns, targets.value_mask]
        est.update_state(state, batch)
        out.append(est.sampling_weights(state, SAMPLED))
    return [_finite(x) for x in out]


def _loss_outputs(loss: PolicyLoss) -> list[Any]:
    """The loss, its gradient, metrics and terms, and the per-token state."""
    inputs = _loss_inputs()
    output = loss(inputs)
    (grad,) = torch.autograd.grad(output.loss, inputs.logprobs)
    out: list[Any] = [output.loss.detach(), grad]
    for metrics in (output.metrics, output.terms):
        out += [sorted(metrics), *(metrics[k] for k in sorted(metrics))]
    out.append(loss.token_state(inputs.logprobs.detach(), inputs.reference, inputs.advantages))
    return [_finite(x) for x in out]


def _same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or not torch.equal(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True


def _run(section: str, part: Any) -> list[Any]:
    return _estimator_outputs(part.build()) if section == "advantage" else _loss_outputs(part.build())


CASES = [("advantage", *case) for case in _cases("advantage")] + [("loss", *case) for case in _cases("loss")]


@pytest.mark.parametrize(
    ("section", "tag", "cls", "field"), CASES, ids=[f"algo.{s}.{f}[{t}]" for s, t, _, f in CASES]
)
def test_every_algorithm_key_changes_what_its_component_computes(section, tag, cls, field):
    default, value = _changed(cls, field)
    base = _run(section, cls())
    changed = _run(section, cls(**{field: value}))
    what = "advantages, critic targets and sampling weights" if section == "advantage" else "loss and metrics"
    if _same(base, changed):
        pytest.fail(
            f"algo.{section}.{field} (type {tag}) is accepted but not read: changing it from {default!r} to "
            f"{value!r} leaves the {what} unchanged on inputs where it should matter",
            pytrace=False,
        )


def test_the_walk_covers_every_builtin_class_and_the_fields_a_reader_would_expect():
    """A guard on the walk itself (not a list the test depends on): the built-in types and some fields
    that must be found."""
    found = {(s, t, f) for s, t, _, f in CASES}
    assert {t for s, t, _ in found if s == "advantage"} == {
        "skip_observation_gae", "token_gae", "step_gae", "grpo", "running_mean", "spo"
    }  # fmt: skip
    assert {t for s, t, _ in found if s == "loss"} == {"dis", "ppo_clip"}
    assert {("advantage", "spo", "d_half"), ("advantage", "step_gae", "step_value")} <= found
    assert {("loss", "dis", "agg"), ("loss", "ppo_clip", "nll_coef")} <= found


def test_the_fixed_inputs_put_ratios_below_inside_and_above_every_default_band():
    inputs = _loss_inputs()
    for tag, cls in (union_variants(AlgoConfig, "loss") or {}).items():
        if tag == "custom":
            continue
        state = cls().token_state(inputs.logprobs.detach(), inputs.reference, inputs.advantages)
        assert set(state[inputs.action_mask].tolist()) == {-1, 0, 1}, tag
