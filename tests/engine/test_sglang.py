"""SGLangEngine: the request/response mapping on JSON shaped like SGLang 0.5's native API (always run), and a
real SGLang server (``-m gpu``: needs CUDA and sglang, in this interpreter or ``$SAO_SGLANG_PYTHON``)."""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from sao.engine.sglang import SGLangEngine, sglang_server_command, supports_pause_modes
from sao.engine.sglang_api import generate_request, parse_generate_chunk
from sao.engine.types import Generation, InferenceEngine, InvalidRequestError, SamplingParams
from sao.models.loading import load_policy
from sao.models.tiny import tiny_checkpoint

from .teacher import trainer_logprobs


def _chunk(output_ids: list[int], logprobs: list[float], finish: dict | None = None) -> dict:
    """A ``/generate`` stream chunk as SGLang's tokenizer manager emits it (return_logprob, no text in
    logprobs): ``text``, ``output_ids`` and ``meta_info`` with ``[logprob, token_id, null]`` entries."""
    return {
        "text": "",
        "output_ids": output_ids,
        "meta_info": {
            "id": "sao-0f3a",
            "finish_reason": finish,
            "prompt_tokens": 4,
            "weight_version": "3",
            "num_retractions": 0,
            "input_token_logprobs": [],
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, output_ids, strict=True)],
            "reasoning_tokens": 0,
            "completion_tokens": len(output_ids),
            "cached_tokens": 0,
        },
    }


_IDS, _LPS = [28, 163, 171], [-5.962663173675537, -5.7083563804626465, -5.669686794281006]
# Default (cumulative) streaming: every chunk repeats all tokens so far.
_CUMULATIVE = [
    _chunk(_IDS[:1], _LPS[:1]),
    _chunk(_IDS[:2], _LPS[:2]),
    _chunk(_IDS, _LPS, {"type": "stop", "matched": 171}),
]
# --incremental-streaming-output: every chunk carries only its new tokens.
_INCREMENTAL = [
    _chunk(_IDS[:1], _LPS[:1]),
    _chunk(_IDS[1:2], _LPS[1:2]),
    _chunk(_IDS[2:], _LPS[2:], {"type": "stop", "matched": 171}),
]


def _replay(chunks: list[dict], incremental: bool) -> tuple[list[int], list[float], list]:
    ids: list[int] = []
    lps: list[float] = []
    finishes = []
    for chunk in chunks:
        delta = parse_generate_chunk(json.loads(json.dumps(chunk)), len(ids), incremental)
        ids += delta.token_ids
        lps += delta.logprobs
        finishes.append((delta.finish_reason, delta.stop_reason))
    return ids, lps, finishes


@pytest.mark.parametrize(("chunks", "incremental"), [(_CUMULATIVE, False), (_INCREMENTAL, True)])
def test_stream_chunks_add_up_to_the_generation(chunks: list[dict], incremental: bool) -> None:
    ids, lps, finishes = _replay(chunks, incremental)
    assert (ids, lps) == (_IDS, _LPS)
    assert finishes == [(None, None), (None, None), ("stop", 171)]


def test_chunk_reports_length_abort_and_the_servers_weight_version() -> None:
    length = parse_generate_chunk(_chunk(_IDS, _LPS, {"type": "length", "length": 3}), 2)
    assert (length.token_ids, length.finish_reason, length.server_version) == ((171,), "length", "3")
    stop_string = parse_generate_chunk(_chunk(_IDS, _LPS, {"type": "stop", "matched": "\n"}), 3)
    assert (stop_string.token_ids, stop_string.stop_reason) == ((), "\n")
    aborted = parse_generate_chunk(_chunk(_IDS[:1], _LPS[:1], {"type": "abort", "message": "Abort"}), 0)
    assert (aborted.finish_reason, aborted.invalid_request) == ("abort", False)


def test_server_rejections_are_invalid_requests() -> None:
    too_long = {
        "type": "abort",
        "message": "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        "status_code": 400,
        "err_type": "BadRequestError",
    }
    delta = parse_generate_chunk(_chunk([], [], too_long), 0)
    assert (delta.finish_reason, delta.invalid_request) == ("abort", True) and "context length" in delta.error
    new_style = {
        "error": {"message": "bad", "type": "invalid_request_error", "code": 400, "retryable": False}
    }
    old_style = {"error": {"message": "bad"}}  # SGLang < 0.5: a ValueError, no code
    for chunk in (new_style, old_style):
        assert parse_generate_chunk(chunk, 0).invalid_request
    assert not parse_generate_chunk({"error": {"message": "oom", "code": 500}}, 0).invalid_request


def test_dict_shaped_logprob_entries_are_read_too() -> None:
    chunk = _chunk(_IDS[:1], _LPS[:1])
    chunk["meta_info"]["output_token_logprobs"] = [{"logprob": _LPS[0], "token_id": _IDS[0], "text": None}]
    assert parse_generate_chunk(chunk, 0).token_ids == (28,)


def test_chunk_whose_ids_disagree_with_its_logprobs_is_refused() -> None:
    chunk = copy.deepcopy(_CUMULATIVE[1])
    chunk["output_ids"] = [28, 999]
    with pytest.raises(ValueError, match="disagree"):
        parse_generate_chunk(chunk, 1)


def test_generate_request_maps_every_sampling_field() -> None:
    params = SamplingParams(
        max_new_tokens=9, temperature=0.8, top_p=0.95, top_k=40, stop_token_ids=(7,), stop=("</s>",), seed=3
    )
    body = generate_request([5, 6, 7], params, request_id="r1", max_model_len=10)
    sampling = body["sampling_params"]
    assert (body["input_ids"], body["rid"], body["stream"]) == ([5, 6, 7], "r1", True)
    assert (body["return_logprob"], body["logprob_start_len"], body["top_logprobs_num"]) == (True, -1, 0)
    assert sampling["max_new_tokens"] == 7  # capped by the context left: 10 - 3
    assert (sampling["temperature"], sampling["top_p"], sampling["top_k"]) == (0.8, 0.95, 40)
    assert (sampling["stop_token_ids"], sampling["stop"], sampling["sampling_seed"]) == ([7], ["</s>"], 3)
    assert (sampling["ignore_eos"], sampling["no_stop_trim"], sampling["repetition_penalty"]) == (
        True,
        True,
        1.0,
    )
    plain = generate_request([5], SamplingParams(), request_id="r2")["sampling_params"]
    assert "stop" not in plain and "stop_token_ids" not in plain and "sampling_seed" not in plain
    assert plain["max_new_tokens"] == 256 and plain["top_k"] == -1


@pytest.mark.parametrize(
    ("prompt", "params"),
    [
        ([], SamplingParams()),
        ([1, 2.5], SamplingParams()),
        ([1] * 10, SamplingParams()),
        ([1], SamplingParams(top_k=0)),
    ],
)
def test_generate_request_rejects_invalid_requests(prompt: list, params: SamplingParams) -> None:
    with pytest.raises(InvalidRequestError):
        generate_request(prompt, params, request_id="r", max_model_len=10)


def test_pause_modes_exist_from_sglang_0_5_6() -> None:
    assert not supports_pause_modes("0.5.5")
    assert (
        supports_pause_modes("0.5.6")
        and supports_pause_modes("0.5.23")
        and supports_pause_modes("0.5.10.post1")
    )
    assert supports_pause_modes(None)


def test_engine_implements_the_inference_engine_protocol() -> None:
    engine = SGLangEngine("http://127.0.0.1:9", version=2, max_model_len=64)
    assert isinstance(engine, InferenceEngine) and engine.version == 2
    asyncio.run(engine.close())


def test_server_command_streams_deltas_and_keeps_the_radix_cache() -> None:
    argv = sglang_server_command("/m", python="/py", port=30000, dtype="float32", extra_args=["--tp", "1"])
    assert argv[:3] == ["/py", "-m", "sglang.launch_server"]
    assert "--incremental-streaming-output" in argv and "--disable-radix-cache" not in argv
    assert argv[-2:] == ["--tp", "1"]


# ---- a real SGLang server (GPU) ----------------------------------------------------------------------------


def _sglang_python() -> str | None:
    if os.environ.get("SAO_SGLANG_PYTHON"):
        return os.environ["SAO_SGLANG_PYTHON"]
    return None if importlib.util.find_spec("sglang") is None else "python"


@pytest.mark.gpu
def test_real_server_logprobs_match_the_trainer_and_survive_an_in_flight_update(tmp_path: Path) -> None:
    python = _sglang_python()
    if not torch.cuda.is_available() or python is None:
        pytest.skip("needs CUDA and sglang (this interpreter or $SAO_SGLANG_PYTHON)")
    model_dir = tiny_checkpoint(tmp_path / "model", "qwen3", "small", seed=0)
    base = load_policy(model_dir, dtype="float32", device="cpu").eval()
    gen_rng = torch.Generator().manual_seed(0)
    new_state = {k: v + 0.02 * torch.randn(v.shape, generator=gen_rng) for k, v in base.state_dict().items()}
    updated = load_policy(model_dir, dtype="float32", device="cpu").eval()
    updated.load_state_dict(new_state)
    prompt = [72, 101, 108, 108, 111]
    # fp32 end to end; the torch-native attention supports any head size.
    args = ["--attention-backend", "torch_native", "--disable-cuda-graph", "--mem-fraction-static", "0.3"]

    async def run() -> tuple[Generation, Generation]:
        engine = await SGLangEngine.launch(
            model_dir, python=None if python == "python" else python, dtype="float32", extra_args=args,
            recompute_kv_on_update=True, log_path=tmp_path / "sglang.log",
        )  # fmt: skip
        try:
            first = await engine.generate(prompt, SamplingParams(max_new_tokens=32, seed=1))
            task = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=3000, seed=2)))
            while engine.stats()["in_flight_tokens"] < 30:
                assert not task.done()
                await asyncio.sleep(0.005)
            await engine.update_weights(new_state, version=1)
            return first, await task
        finally:
            await engine.close()

    first, spanning = asyncio.run(run())
    # GPU fp32 kernels differ from the CPU reference in the last bits; 1e-3 still pins the distribution.
    assert (
        max(abs(a - b) for a, b in zip(first.logprobs, trainer_logprobs(base, prompt, first), strict=True))
        < 1e-3
    )
    assert spanning.finish_reason == "length" and len(spanning.token_ids) == 3000
    k = spanning.versions.count(0)
    assert 30 <= k < 3000 and spanning.versions == [0] * k + [1] * (3000 - k)
    old = trainer_logprobs(base, prompt, spanning)[:k]
    new = trainer_logprobs(updated, prompt, spanning)[k:]
    assert max(abs(a - b) for a, b in zip(spanning.logprobs[:k], old, strict=True)) < 1e-3
    assert max(abs(a - b) for a, b in zip(spanning.logprobs[k:], new, strict=True)) < 1e-3
