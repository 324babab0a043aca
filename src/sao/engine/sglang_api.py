"""SGLang's native ``/generate`` API as JSON (written for 0.5.2x): the request body of one token-in/token-out
generation and the mapping of its stream chunks to `TokenDelta`; `sao.engine.sglang.SGLangEngine` sends them.

Generation. ``POST /generate`` with ``input_ids``, ``sampling_params``, ``return_logprob`` and
``logprob_start_len=-1`` (log-probs of output tokens only), streamed. Each chunk's
``meta_info.output_token_logprobs`` holds ``[logprob, token_id, text]`` entries, cumulative by default and
per-chunk deltas when the server runs with ``--incremental-streaming-output`` (`SGLangEngine.launch`
always adds it; `SGLangEngine.attach` reads it from ``/get_server_info``); ``meta_info.finish_reason`` is
``{"type": "stop", "matched": ...}``, ``{"type": "length", ...}`` or ``{"type": "abort", "message": ...,
"status_code": ...}``. As in `VLLMEngine`, EOS is not implied (``ignore_eos``) and penalties are sent
neutral.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sao.engine.http_protocol import TokenDelta, checked_prompt
from sao.engine.types import FinishReason, SamplingParams

__all__ = ["generate_request", "parse_generate_chunk"]

_FINISH_TYPES: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def generate_request(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    request_id: str,
    max_model_len: int | None = None,
    extra_key: str | None = None,
) -> dict[str, Any]:
    """The JSON body of a streamed ``/generate`` request for one token-in/token-out generation.

    ``max_new_tokens`` is capped by the context left after the prompt when ``max_model_len`` is known.
    ``extra_key``: the radix-cache namespace (SGLang's ``RadixKey.extra_key``: only requests with the same
    key share cached KV). Raises `InvalidRequestError` for invalid params, an empty prompt, a non-integer or
    negative token id, or a prompt that leaves no room for one new token.
    """
    prompt, max_new_tokens = checked_prompt(prompt_token_ids, params, max_model_len)
    sampling: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "ignore_eos": True,
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }
    if params.stop_token_ids:
        sampling["stop_token_ids"] = list(params.stop_token_ids)
    if params.stop:
        sampling["stop"] = list(params.stop)
    if params.seed is not None:
        sampling["sampling_seed"] = params.seed
    body: dict[str, Any] = {
        "input_ids": prompt,
        "sampling_params": sampling,
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": 0,
        "return_text_in_logprobs": False,
        "stream": True,
        "rid": request_id,
    }
    if extra_key is not None:
        body["extra_key"] = extra_key
    return body


def _entry(entry: Any) -> tuple[float, int]:
    """(logprob, token id) of one ``output_token_logprobs`` entry: ``[lp, id, text]`` or a dict."""
    if isinstance(entry, Mapping):
        return float(entry["logprob"]), int(entry.get("token_id", entry.get("id")))
    return float(entry[0]), int(entry[1])


def _finish(reason: Any) -> tuple[FinishReason | None, int | str | None, str | None, bool]:
    """(finish_reason, stop_reason, error, invalid_request) from ``meta_info.finish_reason``."""
    if reason is None:
        return None, None, None, False
    if isinstance(reason, str):
        reason = {"type": reason}
    kind = reason.get("type")
    finish = _FINISH_TYPES.get(kind, "error")
    if finish == "stop":
        return "stop", reason.get("matched"), None, False
    if finish == "abort":
        # SGLang aborts requests it cannot serve (e.g. too long) with status 400.
        invalid = reason.get("status_code") in (400, 422)
        return "abort", None, reason.get("message"), invalid
    return finish, None, None if finish != "error" else f"SGLang finish_reason {reason!r}", False


def parse_generate_chunk(chunk: Mapping[str, Any], received: int, incremental: bool = False) -> TokenDelta:
    """Map one ``/generate`` stream chunk to a `TokenDelta` for a request that has ``received`` tokens.

    ``incremental``: the server streams per-chunk deltas (``--incremental-streaming-output``); otherwise each
    chunk repeats everything so far and the new tokens are those past ``received``. An error chunk becomes
    ``finish_reason="error"`` (``invalid_request`` for code 400/422, or no code: SGLang reports its request
    validation ``ValueError`` that way). An abort with status 400 is an invalid request too. Raises
    ValueError if ``output_ids`` and the log-prob entries disagree (the server is not sending what we asked).
    """
    if "error" in chunk:
        err = chunk["error"]
        if not isinstance(err, Mapping):
            return TokenDelta(finish_reason="error", error=str(err), invalid_request=True)
        invalid = err.get("code") in (None, 400, 422)
        return TokenDelta(finish_reason="error", error=str(err.get("message", err)), invalid_request=invalid)
    meta = chunk.get("meta_info") or {}
    entries = list(meta.get("output_token_logprobs") or ())
    if not incremental:
        entries = entries[received:]
    pairs = [_entry(e) for e in entries]
    token_ids = tuple(t for _, t in pairs)
    output_ids = chunk.get("output_ids")
    if output_ids is not None:
        new_ids = tuple(output_ids if incremental else output_ids[received:])
        if new_ids != token_ids:
            raise ValueError(
                f"SGLang chunk's output_ids {new_ids} disagree with its log-prob entries {token_ids}; "
                "is return_logprob honoured?"
            )
    finish, stop_reason, error, invalid = _finish(meta.get("finish_reason"))
    version = meta.get("weight_version")
    return TokenDelta(
        token_ids=token_ids,
        logprobs=tuple(lp for lp, _ in pairs),
        finish_reason=finish,
        stop_reason=stop_reason,
        error=error,
        invalid_request=invalid,
        server_version=None if version is None else str(version),
    )
