"""Teacher-forced scoring: the log-prob a model gives each token of a fixed sequence, given its prefix.

The weight-push check (`sao.runtime.push_check`) asks every engine replica and the trainer for these
numbers on one probe sequence and compares them. Every engine answers ``score(token_ids)`` with
``len(token_ids) - 1`` floats: ``out[i] = log p(token_ids[i + 1] | token_ids[: i + 1])`` of the *raw*
next-token distribution (temperature 1, no top-k / top-p), in nats. The first token has no prefix and no
entry.

- a model in this process (`LocalEngine`, `ProcessEngine`'s child, the trainer): `score_tokens`, one
  no-grad teacher-forced forward with `sao.models.forward.token_logprobs`;
- a vLLM server: ``/v1/completions`` with the ids as ``prompt``, ``max_tokens=1`` and
  ``prompt_logprobs=0`` (`vllm_score_request`, `parse_vllm_scores`): ``choices[0].prompt_logprobs`` holds
  None for the first token, then ``{token_id: {"logprob": …}}`` with the prompt token among the keys;
- an SGLang server: ``/generate`` with ``input_ids``, ``return_logprob`` and ``logprob_start_len=0``
  (`sglang_score_request`, `parse_sglang_scores`): ``meta_info.input_token_logprobs`` holds one
  ``[logprob, token_id, text]`` entry per input token, the first with logprob None.

Non-finite log-probs are returned as they are (the comparison treats them as a failed push, not as an
unreadable answer).

Owns: the request bodies, the answers' parsing and the in-process forward. Does not own: when to score or
what to compare (`sao.runtime.push_check`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "check_score_ids",
    "parse_sglang_scores",
    "parse_vllm_scores",
    "score_tokens",
    "sglang_score_request",
    "vllm_score_request",
]


def check_score_ids(token_ids: Sequence[int], vocab_size: int | None = None) -> list[int]:
    """``token_ids`` as a list of ints; ValueError unless there are at least 2, each an int in
    ``[0, vocab_size)`` (any non-negative int when ``vocab_size`` is None)."""
    ids = list(token_ids)
    if len(ids) < 2:
        raise ValueError(f"scoring needs at least 2 token ids, got {len(ids)}")
    for i, t in enumerate(ids):
        if (
            isinstance(t, bool)
            or not isinstance(t, int)
            or t < 0
            or (vocab_size is not None and t >= vocab_size)
        ):
            bound = "" if vocab_size is None else f" below the vocabulary size {vocab_size}"
            raise ValueError(f"token id {t!r} at position {i} is not a non-negative int{bound}")
    return ids


def score_tokens(model: Any, token_ids: Sequence[int]) -> list[float]:
    """Teacher-forced log-probs of ``token_ids[1:]`` under ``model`` (an HF causal LM, possibly sharded:
    every rank of an FSDP model must call this with the same ids). One no-grad forward of the ``(1, n)`` row
    on the model's device (position ids ``0 .. n-1``), at temperature 1, logits in fp32, in whatever
    precision the model computes; the model is not changed."""
    import torch

    ids = check_score_ids(token_ids)
    device = next(model.parameters()).device
    row = torch.tensor([ids], device=device)
    positions = torch.arange(len(ids), device=device)[None]
    with torch.no_grad():
        logits = model(input_ids=row, position_ids=positions, use_cache=False).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, row[0, 1:, None])[:, 0]
    return logprobs.cpu().tolist()


def vllm_score_request(token_ids: Sequence[int], model: str) -> dict[str, Any]:
    """The JSON body of a non-streamed ``/v1/completions`` request that scores ``token_ids`` (one token is
    generated and ignored; neutral sampling so no server default reshapes the distribution)."""
    return {
        "model": model, "prompt": check_score_ids(token_ids), "max_tokens": 1, "prompt_logprobs": 0,
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "ignore_eos": True, "stream": False,
    }  # fmt: skip


def parse_vllm_scores(body: Mapping[str, Any], token_ids: Sequence[int]) -> list[float]:
    """The ``len(token_ids) - 1`` log-probs in a ``/v1/completions`` answer to `vllm_score_request`.
    Raises ValueError when the answer lacks them or they are for other tokens."""
    choices = body.get("choices") or []
    entries = choices[0].get("prompt_logprobs") if choices else None
    if not isinstance(entries, list) or len(entries) != len(token_ids):
        got = "none" if not isinstance(entries, list) else f"{len(entries)}"
        raise ValueError(f"vLLM answered {got} prompt log-probs for {len(token_ids)} tokens")
    out = []
    for i, (entry, token) in enumerate(zip(entries[1:], token_ids[1:], strict=True), 1):
        found = None if not isinstance(entry, Mapping) else entry.get(str(token), entry.get(token))
        if not isinstance(found, Mapping) or "logprob" not in found:
            raise ValueError(f"vLLM's prompt log-probs at position {i} do not include token {token}")
        out.append(float(found["logprob"]))
    return out


def sglang_score_request(token_ids: Sequence[int]) -> dict[str, Any]:
    """The JSON body of a non-streamed ``/generate`` request that scores ``token_ids``."""
    sampling = {"max_new_tokens": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                "ignore_eos": True}  # fmt: skip
    return {
        "input_ids": check_score_ids(token_ids), "sampling_params": sampling, "return_logprob": True,
        "logprob_start_len": 0, "top_logprobs_num": 0, "return_text_in_logprobs": False, "stream": False,
    }  # fmt: skip


def parse_sglang_scores(body: Mapping[str, Any], token_ids: Sequence[int]) -> list[float]:
    """The ``len(token_ids) - 1`` log-probs in a ``/generate`` answer to `sglang_score_request`. Raises
    ValueError when the answer lacks them or they are for other tokens."""
    if isinstance(body, list):  # a batch answer of one request
        body = body[0] if body else {}
    entries = (body.get("meta_info") or {}).get("input_token_logprobs")
    if not isinstance(entries, list) or len(entries) != len(token_ids):
        got = "none" if not isinstance(entries, list) else f"{len(entries)}"
        raise ValueError(f"SGLang answered {got} input log-probs for {len(token_ids)} tokens")
    out = []
    for i, (entry, token) in enumerate(zip(entries[1:], token_ids[1:], strict=True), 1):
        if isinstance(entry, Mapping):
            value, got_id = entry.get("logprob"), entry.get("token_id", entry.get("id"))
        else:
            value, got_id = entry[0], entry[1]
        if value is None or int(got_id) != token:
            raise ValueError(f"SGLang's input log-prob at position {i} is not that of token {token}")
        out.append(float(value))
    return out
