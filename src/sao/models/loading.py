"""Loading a policy and its tokenizer from a local Hugging Face checkpoint directory.

Everything is offline (``local_files_only=True``): a path is a directory on disk, never a hub id. A run
config names either a checkpoint (``model.path``) or a tiny architecture (``model.tiny_arch``, with its
tokenizer ``model.tiny_tokenizer``), which `model_from_config` materialises once under a cache directory and
reuses afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from sao.config import ConfigError, ModelConfig
from sao.models.tiny import TinyArch, TinySize, build_named_tokenizer, tiny_checkpoint, tiny_config
from sao.models.tokenizer import TokenizerKind

__all__ = [
    "checkpoint_dir",
    "load_policy",
    "load_tokenizer",
    "model_from_config",
    "resolve_device",
    "resolve_dtype",
    "rope_parameters",
    "tokenizer_dir",
    "with_rope_scaling",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Any of these makes a directory a saved tokenizer (tokenizer_config.json alone: a vocabulary-free one).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> cuda if available else cpu; otherwise ``torch.device(device)``. Raises ValueError for
    an unparsable name or a CUDA device that is not there."""
    if isinstance(device, torch.device):
        resolved = device
    elif device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            resolved = torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"invalid device {device!r}: {err}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(resolved)!r} requested but CUDA is not available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(resolved)!r} requested but only {torch.cuda.device_count()} GPU(s)"
            )
    return resolved


def resolve_dtype(dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu") -> torch.dtype:
    """``"auto"`` -> bfloat16 on CUDA, float32 elsewhere; or one of float32 / bfloat16 / float16."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def _model_dir(path: str | Path) -> Path:
    """``path`` as a directory; FileNotFoundError naming it when it is missing or a file."""
    directory = Path(path)
    if directory.is_dir():
        return directory
    if directory.exists():
        raise FileNotFoundError(f"{str(directory)!r} is a file, not a model directory")
    raise FileNotFoundError(f"model directory {str(directory)!r} does not exist")


def checkpoint_dir(path: str | Path) -> Path:
    """``path`` when it is a Hugging Face checkpoint directory (it holds ``config.json``); otherwise
    FileNotFoundError naming the directory and what is missing."""
    directory = _model_dir(path)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{str(directory)!r} is not a Hugging Face checkpoint: no config.json")
    return directory


def tokenizer_dir(path: str | Path) -> Path:
    """``path`` when it is a directory holding a saved tokenizer (one of `_TOKENIZER_FILES`); otherwise
    FileNotFoundError naming the directory and the files looked for."""
    directory = _model_dir(path)
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        looked_for = ", ".join(_TOKENIZER_FILES)
        raise FileNotFoundError(f"{str(directory)!r} has no tokenizer (none of {looked_for})")
    return directory


def load_tokenizer(path: str | Path, chat_template: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer saved in checkpoint directory ``path`` (offline); ``chat_template`` (a shipped name or a
    file, `sao.models.templates.load_chat_template`) replaces its chat template. Raises FileNotFoundError
    for a missing directory or one without tokenizer files (`tokenizer_dir`), ValueError for an unknown
    template."""
    directory = tokenizer_dir(path)
    template = None
    if chat_template is not None:
        from sao.models.templates import load_chat_template

        template = load_chat_template(chat_template)  # before loading: a bad name fails fast
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def load_policy(
    path: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """A causal LM from checkpoint directory ``path``, in ``dtype`` on ``device`` (see `resolve_device`,
    `resolve_dtype`). Raises FileNotFoundError (missing directory, config or weights) or ValueError (the
    config is not a causal-LM architecture), each naming the path."""
    directory = checkpoint_dir(path)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(
            f"{str(directory)!r} holds a {config.model_type!r} model, which is not a causal language model"
        )
    if not any((directory / name).is_file() for name in _WEIGHT_FILES):
        raise FileNotFoundError(f"{str(directory)!r} has no weights ({' or '.join(_WEIGHT_FILES)})")
    target = resolve_device(device)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = AutoModelForCausalLM.from_pretrained(
        directory, dtype=resolve_dtype(dtype, target), local_files_only=True, **kwargs
    )
    return model.to(target)


def _tiny_digest(arch: TinyArch, size: TinySize, tokenizer_kind: TokenizerKind = "byte") -> str:
    """8 hex digits naming what a tiny checkpoint holds (config and tokenizer of ``tokenizer_kind``), so a
    cached one is rebuilt when either changes."""
    tokenizer = build_named_tokenizer(tokenizer_kind)
    content = tiny_config(arch, size, tokenizer_kind).to_json_string(use_diff=False)
    content += tokenizer.backend_tokenizer.to_str() + str(tokenizer.chat_template)
    return hashlib.sha256(content.encode()).hexdigest()[:8]


def model_from_config(cfg: ModelConfig, cache_dir: str | Path, seed: int = 0) -> Path:
    """The checkpoint directory a run config names: ``cfg.path``, or for ``cfg.tiny_arch`` a tiny checkpoint
    with tokenizer ``cfg.tiny_tokenizer`` under ``cache_dir`` (built on first use, atomically, then reused
    while its config and tokenizer are unchanged; one directory per arch, size, tokenizer and seed); with
    ``cfg.rope_scaling``, that checkpoint with the scaling applied (`with_rope_scaling`, under
    ``cache_dir``), so that every component loading the run's model sees the same rope parameters. The
    checkpoint keeps its tokenizer's default template: ``cfg.chat_template`` is applied when the run loads
    it (`sao.runtime.build.build_tokenizer`). Raises `ConfigError` naming ``model.path`` when that is not
    a directory holding ``config.json`` and a tokenizer (the weights are checked when loaded)."""
    source = _source_checkpoint(cfg, Path(cache_dir), seed)
    if cfg.rope_scaling is None:
        return source
    return with_rope_scaling(source, cfg.rope_scaling, cache_dir)


def _source_checkpoint(cfg: ModelConfig, cache_dir: Path, seed: int) -> Path:
    if cfg.tiny_arch is None:
        assert cfg.path is not None  # ModelConfig holds exactly one of path / tiny_arch
        try:  # here, before anything loads it, so the error names the key
            return tokenizer_dir(checkpoint_dir(cfg.path))
        except FileNotFoundError as err:
            raise ConfigError(f"model.path: {err}") from None
    cache = Path(cache_dir)
    kind = cfg.tiny_tokenizer
    digest = _tiny_digest(cfg.tiny_arch, cfg.tiny_size, kind)
    name = f"tiny-{cfg.tiny_arch}-{cfg.tiny_size}" + ("" if kind == "byte" else f"-{kind}")
    target = cache / f"{name}-seed{seed}-{digest}"
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache))
    try:
        tiny_checkpoint(scratch, cfg.tiny_arch, cfg.tiny_size, seed, tokenizer=kind)
        os.rename(scratch, target)  # atomic: a reader never sees a half-written checkpoint
    except OSError:
        if not target.is_dir():  # not the lost race with another process building the same checkpoint
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def rope_parameters(rope_scaling: Mapping[str, Any], base: Mapping[str, Any] | None) -> dict[str, Any]:
    """``rope_scaling`` (Hugging Face's dict; the legacy ``type`` key read as ``rope_type``) merged over a
    checkpoint's ``rope_parameters`` ``base`` (which keeps its ``rope_theta``). Raises `ConfigError` naming
    ``model.rope_scaling`` for an unknown rope type or a ``factor`` below 1."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(rope_scaling)
    if "type" in scaling:
        scaling.setdefault("rope_type", scaling.pop("type"))
    kind = scaling.get("rope_type")
    if kind not in ("default", *ROPE_INIT_FUNCTIONS):
        known = ", ".join(sorted(ROPE_INIT_FUNCTIONS))
        raise ConfigError(f"model.rope_scaling: unknown rope_type {kind!r}; transformers knows {known}")
    factor = scaling.get("factor", 1.0)
    if not isinstance(factor, int | float) or factor < 1:
        raise ConfigError(f"model.rope_scaling: factor must be a number >= 1, got {factor!r}")
    return {**dict(base or {}), **scaling}


def with_rope_scaling(checkpoint: str | Path, rope_scaling: Mapping[str, Any], cache_dir: str | Path) -> Path:
    """A checkpoint directory under ``cache_dir`` that is ``checkpoint`` with its config's rope parameters
    replaced by `rope_parameters` of ``rope_scaling``: ``config.json`` rewritten, every other entry a symlink
    to the original (weights are not copied). Built once per original config and scaling (a digest names
    it), atomically, and reused. Raises FileNotFoundError for a missing checkpoint, `ConfigError` (naming
    ``model.rope_scaling``) for a scaling transformers cannot use."""
    source = checkpoint_dir(checkpoint).resolve()
    original = (source / "config.json").read_bytes()
    key = json.dumps(dict(rope_scaling), sort_keys=True).encode()
    digest = hashlib.sha256(str(source).encode() + original + key).hexdigest()[:8]
    cache = Path(cache_dir)
    target = cache / f"{source.name}-rope-{digest}"
    if target.is_dir():
        return target
    config = AutoConfig.from_pretrained(source, local_files_only=True)
    config.rope_parameters = rope_parameters(rope_scaling, getattr(config, "rope_parameters", None))
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache))
    try:
        config.save_pretrained(scratch)
        for entry in source.iterdir():
            if entry.name != "config.json":
                (scratch / entry.name).symlink_to(entry)
        os.rename(scratch, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
