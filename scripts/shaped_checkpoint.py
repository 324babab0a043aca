"""Write a randomly initialised Hugging Face checkpoint with the shape of a real model's config.

The shape comes from `sao.plan.architecture.KNOWN_ARCHITECTURES` (the public config.json of Qwen/Qwen3-0.6B,
Qwen/Qwen3-8B, Qwen/Qwen3-30B-A3B), so a run, a memory benchmark or the GPU check meets real tensor sizes
without a download. The weights are the model's own initialisation under ``--seed``; the tokenizer is sao's
locally trained byte-level BPE (`sao.models.bpe`, ~4k tokens) with a shipped chat template (default
``qwen3``). The vocabulary stays the real one (151,936 rows of embeddings and LM head), so the shapes are
real; the tokenizer's ids are a subset of it, and the config's special-token ids are the tokenizer's.

    python scripts/shaped_checkpoint.py --arch qwen3-0.6b --out runs/shaped/qwen3-0.6b
    python scripts/shaped_checkpoint.py --arch qwen3-0.6b --layers 4 --out /tmp/slice   # a few-layer slice
    python scripts/shaped_checkpoint.py --arch qwen3-0.6b --tiny --out /tmp/tiny         # CPU dry runs

``--tiny``: hidden 64, 2 layers, 4 heads (2 KV) of 16, MLP 128 (MoE: 4 experts of 32, top 2), and the
tokenizer's own vocabulary (4,096) instead of the real one unless ``--vocab`` says otherwise. Weights are
saved in ``--dtype`` (default bfloat16) as safetensors files of at most ``--shard-size`` plus their index
(``model.safetensors.index.json``), as published checkpoints are. ``--device cuda`` initialises on the GPU
(an 8B model in seconds rather than minutes). Prints one JSON line: the directory, parameters, files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

_TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}


def shaped_config(
    arch: str, *, tiny: bool = False, layers: int | None = None, vocab: int | None = None
) -> Any:
    """The transformers config of ``arch`` (a `KNOWN_ARCHITECTURES` name or alias, e.g. ``qwen3-0.6b``),
    shrunk by ``tiny``, with ``layers`` decoder layers and ``vocab`` rows when given, and the BPE
    tokenizer's special-token ids. Raises ValueError for an unknown ``arch``."""
    from transformers import AutoConfig

    from sao.models.bpe import VOCAB_SIZE, build_bpe_tokenizer
    from sao.models.tokenizer import EOS_TOKEN, PAD_TOKEN
    from sao.plan.architecture import KNOWN_ARCHITECTURES, known_config

    known = known_config(arch)
    if known is None:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(KNOWN_ARCHITECTURES)}")
    values = dict(known[1])
    model_type = values.pop("model_type")
    if tiny:
        moe = model_type == "qwen3_moe"
        values.update({k: v for k, v in _TINY.items() if moe or not k.startswith(("moe_", "num_experts"))})
        values["vocab_size"] = VOCAB_SIZE
    if layers is not None:
        values["num_hidden_layers"] = layers
    if vocab is not None:
        values["vocab_size"] = vocab
    tokenizer = build_bpe_tokenizer()
    if values["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab {values['vocab_size']} is smaller than the tokenizer's {len(tokenizer)} ids")
    pad, eos = tokenizer.convert_tokens_to_ids(PAD_TOKEN), tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    values.update(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    values["rope_parameters"] = {"rope_type": "default", "rope_theta": float(values.pop("rope_theta"))}
    return AutoConfig.for_model(model_type, **values)


def write_shaped_checkpoint(
    out: Path,
    arch: str,
    *,
    tiny: bool = False,
    layers: int | None = None,
    vocab: int | None = None,
    dtype: str = "bfloat16",
    shard_size: str = "500MB",
    chat_template: str = "qwen3",
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Write the checkpoint into ``out`` (created) and return what was written (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from sao.models.bpe import build_bpe_tokenizer
    from sao.models.templates import load_chat_template

    config = shaped_config(arch, tiny=tiny, layers=layers, vocab=vocab)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        if device.startswith("cuda"):
            torch.cuda.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[config.eos_token_id, config.pad_token_id],  # end of turn or of text, as Qwen3's
        pad_token_id=config.pad_token_id,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size=shard_size)
    build_bpe_tokenizer(chat_template=load_chat_template(chat_template)).save_pretrained(out)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    return {
        "out": str(out),
        "arch": arch,
        "parameters": model.num_parameters(),
        "dtype": dtype,
        "files": files,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", required=True, help="qwen3-0.6b, qwen3-8b, qwen3-30b-a3b (or Qwen/...)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tiny", action="store_true", help="a tiny shape of the same family (CPU dry runs)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (a slice of the model)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary rows (default: the config's)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--shard-size", default="500MB", help="largest safetensors file (as save_pretrained)")
    parser.add_argument("--chat-template", default="qwen3", help="a shipped template name or a .jinja file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where to initialise: cpu or cuda")
    args = parser.parse_args(argv)
    try:
        written = write_shaped_checkpoint(
            args.out, args.arch, tiny=args.tiny, layers=args.layers, vocab=args.vocab, dtype=args.dtype,
            shard_size=args.shard_size, chat_template=args.chat_template, seed=args.seed, device=args.device,
        )  # fmt: skip
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
