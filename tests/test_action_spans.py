"""`action_span_bounds` is the one definition of an action span: it agrees with a plain loop over tokens,
and with the spans step-wise GAE (`sao.algos.gae.step_spans`) and the trainer's turn count use."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.algos.gae import step_spans
from sao.algos.packed import action_span_bounds


def _loop_bounds(
    action: list[bool], turns: list[int] | None, seqs: list[int]
) -> tuple[list[bool], list[bool]]:
    """Starts and ends by walking the tokens: t + 1 continues t's span when both are action tokens of the
    same turn (if turns are told apart) and the same trajectory."""
    n = len(action)

    def joined(t: int) -> bool:
        same_turn = turns is None or turns[t] == turns[t + 1]
        return action[t] and action[t + 1] and same_turn and seqs[t] == seqs[t + 1]

    starts = [action[t] and not (t > 0 and joined(t - 1)) for t in range(n)]
    ends = [action[t] and not (t < n - 1 and joined(t)) for t in range(n)]
    return starts, ends


@st.composite
def _packed(draw):
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))
    total = sum(lengths)
    action = draw(st.lists(st.booleans(), min_size=total, max_size=total))
    turns = draw(st.lists(st.integers(-1, 2), min_size=total, max_size=total))
    seqs = [b for b, n in enumerate(lengths) for _ in range(n)]
    return lengths, action, turns, seqs


@settings(max_examples=200, deadline=None)
@given(_packed(), st.booleans())
def test_span_bounds_match_a_loop_over_tokens(packed, with_turns):
    _, action, turns, seqs = packed
    turn_ids = torch.tensor(turns) if with_turns else None
    mask = torch.tensor(action)
    before = mask.clone()
    starts, ends = action_span_bounds(mask, turn_ids, torch.tensor(seqs))
    want_starts, want_ends = _loop_bounds(action, turns if with_turns else None, seqs)
    assert starts.tolist() == want_starts and ends.tolist() == want_ends
    assert torch.equal(mask, before)  # the input is not modified


@settings(max_examples=200, deadline=None)
@given(_packed(), st.booleans())
def test_step_gae_spans_are_the_same_spans(packed, with_turns):
    lengths, action, turns, seqs = packed
    mask, turn_ids = torch.tensor(action), torch.tensor(turns) if with_turns else None
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    starts, ends = action_span_bounds(mask, turn_ids, torch.tensor(seqs))
    step_of_token, step_cu, is_last = step_spans(mask, cu, turn_ids)
    assert torch.equal(is_last, ends)
    assert int(step_cu[-1]) == int(starts.sum())
    first_of_step = mask.clone()
    first_of_step[1:] &= step_of_token[1:] != step_of_token[:-1]
    assert torch.equal(first_of_step, starts)


def test_one_trajectory_needs_no_seq_ids_and_empty_input_has_no_spans():
    action = torch.tensor([False, True, True, True, False, True])
    turns = torch.tensor([-1, 0, 0, 1, 1, 2])
    starts, ends = action_span_bounds(action, turns)
    assert starts.nonzero().squeeze(-1).tolist() == [1, 3, 5]
    assert ends.nonzero().squeeze(-1).tolist() == [2, 3, 5]
    starts, ends = action_span_bounds(torch.zeros(0, dtype=torch.bool))
    assert starts.shape == ends.shape == (0,)
