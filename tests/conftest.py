"""Session-wide tiny checkpoints (built once, seed 0, size "test") shared by model and training tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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
def tiny_bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-MoE checkpoint with the local BPE tokenizer and its default, Qwen3-like template
    (`sao.models.bpe`). Treat as read-only."""
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny_bpe"), "qwen3_moe", "test", seed=0, tokenizer="bpe")


STEER_WORDS = [" the", " sum", " is", " step", " think", " answer", " first", " then", ".", "\n", "\n\n", ":"]


@pytest.fixture(scope="session")
def steer_bpe():
    """``steer_bpe(model_dir, tokenizer)``: the BPE model with a biased LM head (see `steered_policy`)."""
    return steered_policy


def steered_policy(model_dir, tok):
    """The tiny model with a biased LM head: it writes BPE word pieces, ``<think>``/``</think>``,
    ``<tool_call>``/``</tool_call>`` and ``<|im_end|>`` only (no digits: no episode ends by answering)."""
    from sao.models.loading import load_policy

    model = load_policy(model_dir, dtype="float32", device="cpu")
    head = model.get_output_embeddings()
    allowed = {i for w in STEER_WORDS for i in tok(w, add_special_tokens=False)["input_ids"]}
    allowed |= {i for w in STEER_WORDS for i in tok(w.strip() or w, add_special_tokens=False)["input_ids"]}
    allowed |= {
        i for w in ("th", "e", "s", "um", " a", "n") for i in tok(w, add_special_tokens=False)["input_ids"]
    }
    markers = {
        m: tok.convert_tokens_to_ids(m) for m in ("<think>", "</think>", "<tool_call>", "</tool_call>")
    }
    bias = torch.full((head.out_features,), -1e4)
    bias[sorted(allowed)] = 0.0
    bias[list(markers.values())] = 1.5
    bias[markers["<think>"]] = 4.0
    bias[tok.convert_tokens_to_ids("<|im_end|>")] = 1.0
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.copy_(bias)
    model.set_output_embeddings(biased)
    return model


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_moe_dir: Path):
    """The local byte-level tokenizer with the Qwen-style chat template, as saved in the checkpoint."""
    from sao.models.loading import load_tokenizer

    return load_tokenizer(tiny_moe_dir)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def serve_app():
    """``serve_app(app) -> base URL``: run an ASGI app with uvicorn in a thread until the session ends."""
    import threading
    import time

    import uvicorn

    running = []

    def start(app) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 30
        while not server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        running.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=10)
