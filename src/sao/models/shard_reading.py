"""Filling a rank's FSDP2 shards from a safetensors checkpoint, reading only the rows the rank holds
(`sao.models.sharded_loading` builds the sharded meta model and calls this).

Each local shard is filled from the checkpoint's file(s) with only its rows
(``safe_open(...).get_slice(name)[start:end]``), one tensor at a time, in blocks of at most
``_BLOCK_BYTES``. A rank's peak is its shard plus one block (and that block's mapped file pages: each block
opens and closes the file, so pages already read never stay resident).

Rows: FSDP2 shards dim 0 like ``torch.chunk`` (``ceil(N / W)`` rows per rank, the last ranks shorter or
empty, padding kept out of the local tensor); `local_rows` derives a rank's rows that way and checks them
against the local tensor FSDP made.

The checkpoint's layout, as `load_policy` / `load_critic` read it:

- MoE experts (`sao.models.moe_names`): one tensor per expert on disk, fused ``gate_up_proj (E, 2I, H)`` /
  ``down_proj (E, H, I)`` in memory. Dim 0 is the expert, so a rank reads only the experts of its rows.
- Tied parameters (an LM head tied to the embedding) are one parameter; the checkpoint holds it under
  either name.
- Persistent buffers are read whole (FSDP does not shard buffers). Non-persistent buffers are not in a
  checkpoint and ``to_empty`` leaves them uninitialised: the rotary embeddings' (``inv_freq``,
  ``original_inv_freq``) are recomputed from the config as transformers computes them; any other is an
  error.
- Tensors the model lacks, or that the checkpoint lacks, are errors naming them; tolerated extras are a
  policy's LM head in a critic's source and stale copies of non-persistent buffers (old checkpoints).

Owns: the checkpoint's tensor index, the check of the model against it (`ReadPlan`) and the filling. Does not
own: building or sharding the model, nor drawing a new value head.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard

from sao.models.moe_names import checkpoint_names

__all__ = ["CheckpointTensors", "ReadPlan", "fill_shards", "local_rows", "recompute_buffers"]

_BLOCK_BYTES = 64 * 2**20  # the most a rank reads (and holds besides its shards) at once
_FUSED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)$")  # moe_names' layout
_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


class CheckpointTensors:
    """The tensors of a safetensors checkpoint directory: name -> file, shape, bytes per element."""

    def __init__(self, directory: Path) -> None:
        single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = {name: directory / file for name, file in weight_map.items()}
        elif single.is_file():
            with safe_open(single, framework="pt") as f:
                files = dict.fromkeys(f.keys(), single)
        else:
            raise FileNotFoundError(
                f"{str(directory)!r} has no safetensors weights (model.safetensors or "
                "model.safetensors.index.json); sharded loading reads safetensors only"
            )
        self.directory, self.files = directory, files
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.itemsizes: dict[str, int] = {}
        for path in sorted(set(files.values())):
            with safe_open(path, framework="pt") as f:  # the header only: no tensor data is read
                for name in f.keys():  # noqa: SIM118 (a safe_open handle is no dict)
                    if files.get(name) != path:
                        continue
                    view = f.get_slice(name)
                    self.shapes[name] = tuple(view.get_shape())
                    self.itemsizes[name] = _ITEMSIZE.get(view.get_dtype(), 8)  # 8: at worst smaller blocks
        missing = sorted(set(files) - set(self.shapes))
        if missing:
            raise ValueError(f"{directory}: the index names tensors its files lack: {missing[:5]}")

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def copy_rows(self, name: str, start: int, end: int, out: Tensor) -> None:
        """``out`` (the shape of rows ``start:end``) <- rows ``start:end`` of tensor ``name``, cast to
        ``out``'s dtype and device, a block of at most ``_BLOCK_BYTES`` at a time."""
        shape = self.shapes[name]
        if not shape:
            with safe_open(self.files[name], framework="pt") as f:
                out.copy_(f.get_tensor(name))
            return
        row_bytes = self.itemsizes[name] * math.prod(shape[1:])
        step = max(1, _BLOCK_BYTES // max(row_bytes, 1))
        for lo in range(start, end, step):
            hi = min(lo + step, end)
            with safe_open(self.files[name], framework="pt") as f:  # closed per block: pages leave RSS
                out[lo - start : hi - start].copy_(f.get_slice(name)[lo:hi])


def local_rows(param: Tensor) -> tuple[Tensor, int, int]:
    """``(local tensor, start, end)``: the rows ``start:end`` of dim 0 this rank holds of ``param`` (an
    FSDP2 DTensor, sharded on dim 0 like ``torch.chunk``; a plain tensor: all rows)."""
    if not isinstance(param, DTensor):
        return param.data, 0, param.shape[0] if param.dim() else 0
    placements = param.placements
    if len(placements) != 1 or placements[0] != Shard(0):
        raise NotImplementedError(f"sharded loading expects a 1-D mesh sharding dim 0, got {placements}")
    mesh = param.device_mesh
    rows = param.shape[0]
    chunk = math.ceil(rows / mesh.size())
    start = min(mesh.get_local_rank() * chunk, rows)
    end = min(start + chunk, rows)
    local = param.to_local()
    if local.shape[0] != end - start:
        raise RuntimeError(
            f"unexpected FSDP layout: rank {mesh.get_local_rank()} holds {local.shape[0]} rows of "
            f"{tuple(param.shape)}, expected {end - start}"
        )
    return local, start, end


def _expert_sources(name: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]] | None:
    """The checkpoint tensors (name -> shape) of fused expert tensor ``name``, None for other names."""
    match = _FUSED.match(name)
    if match is None or len(shape) != 3:
        return None
    prefix, experts = match["prefix"], shape[0]
    if match["kind"] == "down_proj":
        return {f"{prefix}.{e}.down_proj.weight": shape[1:] for e in range(experts)}
    width = shape[1] // 2
    return {
        f"{prefix}.{e}.{proj}.weight": (width, shape[2])
        for e in range(experts)
        for proj in ("gate_proj", "up_proj")
    }


class ReadPlan:
    """What the meta model needs from the checkpoint, checked against it before anything is allocated.

    ``sources``: each (deduplicated) parameter or persistent buffer name -> the checkpoint name it is read
    from (a tied parameter: whichever of its names the checkpoint has). ``optional``: names allowed to be
    missing (then left for the caller to initialise)."""

    def __init__(
        self, model: nn.Module, ckpt: CheckpointTensors, optional: set[str], extras_prefix: str | None
    ):
        expected = checkpoint_names(model)  # experts unfused, tied duplicates dropped, persistent buffers
        aliases: dict[str, list[str]] = {}
        by_id: dict[int, str] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            first = by_id.setdefault(id(param), name)
            aliases.setdefault(first, []).append(name)
        persistent = set(model.state_dict())
        stale = {name for name, _ in model.named_buffers() if name not in persistent}
        self.sources: dict[str, str] = {}
        missing, wrong = [], []
        for name, shape in expected.items():
            source = next((a for a in aliases.get(name, [name]) if a in ckpt), None)
            if source is None:
                if name not in optional:
                    missing.append(name)
                continue
            if ckpt.shapes[source] != tuple(shape):
                wrong.append(f"{source} {ckpt.shapes[source]} (the model's: {tuple(shape)})")
            self.sources[name] = source
        known = set(expected) | {a for names in aliases.values() for a in names} | stale
        extra = [
            n for n in ckpt.files if n not in known and not (extras_prefix and n.startswith(extras_prefix))
        ]
        where = ckpt.directory
        if missing:
            raise ValueError(f"{where}: the checkpoint lacks {len(missing)} tensors: {sorted(missing)[:8]}")
        if extra:
            raise ValueError(
                f"{where}: the checkpoint has {len(extra)} tensors the model does not know: "
                f"{sorted(extra)[:8]}"
            )
        if wrong:
            raise ValueError(f"{where}: {len(wrong)} tensors have the wrong shape: {wrong[:4]}")
        self.persistent_buffers = {n for n, _ in model.named_buffers()} & persistent
        self.stale_buffers = stale


@torch.no_grad()
def fill_shards(model: nn.Module, ckpt: CheckpointTensors, plan: ReadPlan) -> None:
    """Each parameter's local shard and each persistent buffer from the checkpoint (a sharded model after
    ``to_empty``); parameters without a source are left as they are."""
    for name, param in model.named_parameters():
        local, start, end = local_rows(param)
        if start == end:
            continue
        experts = _expert_sources(name, tuple(param.shape))
        if experts is None:
            if name in plan.sources:
                ckpt.copy_rows(plan.sources[name], start, end, local)
            continue
        prefix = _FUSED.match(name)["prefix"]  # type: ignore[index]
        for e in range(start, end):
            row = local[e - start]
            if name.endswith("down_proj"):
                ckpt.copy_rows(f"{prefix}.{e}.down_proj.weight", 0, row.shape[0], row)
                continue
            width = row.shape[0] // 2
            ckpt.copy_rows(f"{prefix}.{e}.gate_proj.weight", 0, width, row[:width])
            ckpt.copy_rows(f"{prefix}.{e}.up_proj.weight", 0, width, row[width:])
    for name, buffer in model.named_buffers():
        if name in plan.persistent_buffers:
            ckpt.copy_rows(plan.sources[name], 0, buffer.shape[0] if buffer.dim() else 0, buffer)


@torch.no_grad()
def recompute_buffers(model: nn.Module, stale: set[str]) -> None:
    """The non-persistent buffers, which ``to_empty`` left uninitialised: a rotary embedding's are
    recomputed on the CPU from its config (as transformers' own initialisation computes them), then copied
    in; any other non-persistent buffer is an error."""
    done: set[str] = set()
    for prefix, module in model.named_modules():
        own = {f"{prefix}.{n}" if prefix else n: n for n, _ in module.named_buffers(recurse=False)}
        own = {full: short for full, short in own.items() if full in stale}
        if not own:
            continue
        if "RotaryEmbedding" not in type(module).__name__ or not hasattr(module, "config"):
            raise NotImplementedError(
                f"sharded loading cannot recompute the non-persistent buffers {sorted(own)} of "
                f"{type(module).__name__}"
            )
        with torch.device("cpu"):
            fresh = type(module)(module.config)
        for full, short in own.items():
            getattr(module, short).copy_(getattr(fresh, short))
            done.add(full)
    left = stale - done
    if left:
        raise NotImplementedError(f"sharded loading cannot recompute the buffers {sorted(left)}")
