"""Weight updates for server engines (vLLM, SGLang): trainer names -> engine names, and the disk hand-off.

The trainer holds transformers' in-memory layout, where a Qwen3-MoE layer's experts are two fused tensors;
vLLM and SGLang load the checkpoint layout, one tensor per expert (`sao.models.moe_names`).
`to_engine_state_dict` maps the one to the other; `write_update_dir` writes the result as a safetensors
checkpoint directory that a server reloads from (vLLM ``reload_weights``, SGLang
``/update_weights_from_disk``). Everything here is pure tensor/file work: no server, no HTTP.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from sao.models.moe_names import unfuse_experts

__all__ = [
    "CONFIG_FILES",
    "WEIGHTS_FILE",
    "cast_state_dict",
    "to_engine_state_dict",
    "write_safetensors",
    "write_update_dir",
]

WEIGHTS_FILE = "model.safetensors"
# Copied next to the weights so that an engine which reads the config from the update directory finds it.
CONFIG_FILES = ("config.json", "generation_config.json")


def cast_state_dict(state_dict: Mapping[str, Tensor], dtype: torch.dtype | None) -> dict[str, Tensor]:
    """The weights an engine of ``dtype`` receives: each floating-point tensor of ``state_dict`` cast to
    ``dtype`` (a new tensor, detached, on the same device), every other tensor and every tensor already in
    ``dtype`` as it is (detached, not copied); ``dtype`` None casts nothing. The input and the tensors it
    holds (the trainer's weights) are never modified. Raises ValueError on a non-tensor value."""
    out: dict[str, Tensor] = {}
    for name, value in state_dict.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"state dict entry {name!r} is a {type(value).__name__}, not a tensor")
        cast = dtype is not None and value.is_floating_point() and value.dtype != dtype
        out[name] = value.detach().to(dtype) if cast else value.detach()
    return out


def to_engine_state_dict(
    state_dict: Mapping[str, Tensor], dtype: torch.dtype | None = None
) -> dict[str, Tensor]:
    """Trainer names -> engine (checkpoint) names, as tensors ready to serialise.

    Fused expert tensors are split per expert (`unfuse_experts`); every other name passes through. Each
    output tensor is detached, on CPU, contiguous and owns its storage (safetensors rejects tensors that
    share memory, as the per-expert views of one fused tensor and tied embeddings do), its floating-point
    tensors cast to ``dtype`` when given. The input is not modified. Raises ValueError on a non-tensor value
    or a malformed fused expert tensor.
    """
    for name, value in state_dict.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"state dict entry {name!r} is a {type(value).__name__}, not a tensor")
    out: dict[str, Tensor] = {}
    for name, tensor in unfuse_experts(state_dict).items():
        cast = dtype is not None and tensor.is_floating_point()
        t = tensor.detach().to("cpu", dtype=dtype) if cast else tensor.detach().cpu()
        out[name] = t.contiguous().clone()
    return out


def write_safetensors(tensors: Mapping[str, Tensor], path: str | Path) -> Path:
    """Write ``tensors`` to the safetensors file ``path`` atomically: a reader sees the old file or the
    complete new one, never a partial write (temporary file in the same directory, fsync, rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(dict(tensors), tmp, metadata={"format": "pt"})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_update_dir(
    state_dict: Mapping[str, Tensor],
    directory: str | Path,
    *,
    config_from: str | Path | None = None,
    config_files: Sequence[str] = CONFIG_FILES,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a trainer state dict as a checkpoint directory an engine can reload from, atomically.

    ``directory`` must not exist; it appears complete (``model.safetensors`` in engine names, plus
    ``config_files`` copied from ``config_from`` when given) or not at all: everything is written into a
    temporary sibling that is renamed at the end. Returns ``directory``. Raises FileExistsError if it exists.
    """
    target = Path(directory)
    if target.exists():
        raise FileExistsError(f"update directory {str(target)!r} already exists")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        write_safetensors(to_engine_state_dict(state_dict, dtype), tmp / WEIGHTS_FILE)
        if config_from is not None:
            for name in config_files:
                source = Path(config_from) / name
                if source.is_file():
                    shutil.copyfile(source, tmp / name)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
