"""Teacher-forced scoring by every engine: `LocalEngine.score` and `ProcessEngine.score` give the trainer's
log-probs of the weights they hold (also while generating), and the vLLM / SGLang request bodies and answers
map to the same ``len - 1`` numbers."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from sao.engine.local import LocalEngine
from sao.engine.process import ProcessEngine
from sao.engine.scoring import (
    parse_sglang_scores,
    parse_vllm_scores,
    score_tokens,
    sglang_score_request,
    vllm_score_request,
)
from sao.engine.types import SamplingParams
from sao.models.loading import load_policy
from sao.models.tiny import build_tiny_model

IDS = torch.randint(0, 250, (40,), generator=torch.Generator().manual_seed(3)).tolist()


def _full_forward_logprobs(model, ids: list[int]) -> list[float]:
    """The reference: one plain HF forward, log-softmax, the next token's entry."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def test_score_tokens_is_the_plain_forwards_next_token_log_prob(tiny_moe_dir):
    model = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
    scores = score_tokens(model, IDS)
    assert len(scores) == len(IDS) - 1
    reference = _full_forward_logprobs(model, IDS)
    torch.testing.assert_close(torch.tensor(scores), torch.tensor(reference), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="at least 2"):
        score_tokens(model, [5])


def test_local_engine_scores_the_weights_it_holds_also_while_generating(tiny_moe_dir):
    other = build_tiny_model("qwen3_moe", "test", seed=1)
    trainer = load_policy(tiny_moe_dir, dtype="float32", device="cpu")

    async def main():
        async with LocalEngine(tiny_moe_dir, device="cpu", dtype="float32") as engine:
            long = asyncio.create_task(engine.generate(IDS[:8], SamplingParams(max_new_tokens=300, seed=0)))
            await asyncio.sleep(0.05)
            before = await engine.score(IDS)
            assert not long.done()  # scored beside a running generation
            await engine.update_weights(other.state_dict(), 1)
            after = await engine.score(IDS)
            with pytest.raises(ValueError, match="vocabulary size"):
                await engine.score([1, engine.vocab_size])
            await long
        return before, after

    before, after = asyncio.run(main())
    torch.testing.assert_close(
        torch.tensor(before), torch.tensor(score_tokens(trainer, IDS)), atol=1e-5, rtol=0
    )
    with torch.no_grad():
        expected = score_tokens(other.float(), IDS)
    torch.testing.assert_close(torch.tensor(after), torch.tensor(expected), atol=1e-5, rtol=0)
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 0.1  # the update is visible


def test_process_engine_scores_in_its_child_like_the_local_engine(tiny_moe_dir):
    trainer = load_policy(tiny_moe_dir, dtype="float32", device="cpu")

    async def main():
        engine = await asyncio.to_thread(
            ProcessEngine, tiny_moe_dir, device="cpu", dtype="float32", threads=1
        )
        try:
            scores = await engine.score(IDS)
            with pytest.raises(ValueError, match="at least 2"):
                await engine.score([])
        finally:
            await engine.close()
        with pytest.raises(RuntimeError, match="closed"):
            await engine.score(IDS)
        return scores

    scores = asyncio.run(main())
    torch.testing.assert_close(
        torch.tensor(scores), torch.tensor(score_tokens(trainer, IDS)), atol=1e-5, rtol=0
    )


def test_vllm_scoring_asks_for_prompt_log_probs_and_reads_the_prompt_tokens_entries():
    ids = [11, 7, 42]
    body = vllm_score_request(ids, "m")
    assert body["prompt"] == ids and body["prompt_logprobs"] == 0 and body["max_tokens"] == 1
    assert body["temperature"] == 1.0 and body["stream"] is False
    answer = {  # vLLM's JSON: token ids as string keys, the prompt token among the top-k
        "choices": [{"text": "x", "prompt_logprobs": [
            None,
            {"7": {"logprob": -1.25, "rank": 2, "decoded_token": "a"}, "3": {"logprob": -0.5, "rank": 1}},
            {"42": {"logprob": -3.0, "rank": 5}},
        ]}]
    }  # fmt: skip
    assert parse_vllm_scores(answer, ids) == [-1.25, -3.0]
    answer["choices"][0]["prompt_logprobs"][2] = {"41": {"logprob": -0.1}}
    with pytest.raises(ValueError, match="position 2 do not include token 42"):
        parse_vllm_scores(answer, ids)
    with pytest.raises(ValueError, match="none prompt log-probs for 3 tokens"):
        parse_vllm_scores({"choices": [{"text": "x"}]}, ids)


def test_sglang_scoring_asks_for_input_log_probs_from_the_first_token():
    ids = [11, 7, 42]
    body = sglang_score_request(ids)
    assert body["input_ids"] == ids and body["logprob_start_len"] == 0 and body["return_logprob"] is True
    assert body["sampling_params"]["temperature"] == 1.0 and body["stream"] is False
    answer = {"text": "x", "meta_info": {"input_token_logprobs": [[None, 11, None], [-0.75, 7, None],
                                                                  [float("nan"), 42, None]]}}  # fmt: skip
    scores = parse_sglang_scores(answer, ids)
    assert scores[0] == -0.75 and math.isnan(
        scores[1]
    )  # non-finite is the comparison's verdict, not an error
    answer["meta_info"]["input_token_logprobs"][1][1] = 8
    with pytest.raises(ValueError, match="position 1 is not that of token 7"):
        parse_sglang_scores(answer, ids)
