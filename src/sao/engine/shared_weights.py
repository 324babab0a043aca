"""`SharedWeights`: a state dict in memory-mapped buffers that another process maps too (weight pushes of
`sao.engine.process.ProcessEngine`). Pure tensor/file work: no processes, no pipes."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["SharedWeights"]


def _shm_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@dataclass
class SharedWeights:
    """A state dict laid out in one flat memory-mapped CPU buffer per dtype, shareable between processes.

    ``files[dtype name] = (path, numel)``: each buffer is a file mapped shared (`torch.from_file`), in
    ``/dev/shm`` where there is one; ``layout[name] = (dtype name, offset, shape)`` locates each tensor in
    its buffer (offset in elements). Pickling sends only these two maps; the receiver maps the same files
    (`attach`). The creator deletes the files (`unlink`) once the receiver has mapped them: a mapping
    outlives its file's name, and nothing is left behind if a process is killed later.
    """

    files: dict[str, tuple[str, int]]
    layout: dict[str, tuple[str, int, tuple[int, ...]]]
    buffers: dict[str, Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def allocate(cls, state: Mapping[str, Tensor]) -> SharedWeights:
        """Mapped buffers sized for ``state`` (not yet filled: call `write`)."""
        sizes: dict[str, int] = {}
        layout: dict[str, tuple[str, int, tuple[int, ...]]] = {}
        for name, tensor in state.items():
            dtype = str(tensor.dtype).removeprefix("torch.")
            offset = sizes.get(dtype, 0)
            layout[name] = (dtype, offset, tuple(tensor.shape))
            sizes[dtype] = offset + tensor.numel()
        stem = _shm_dir() / f"sao-weights-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        files = {dtype: (f"{stem}-{dtype}", max(n, 1)) for dtype, n in sizes.items()}
        return cls(files, layout).attach()

    def attach(self) -> SharedWeights:
        """Map the buffer files (creating them if missing); returns self."""
        for dtype, (path, n) in self.files.items():
            self.buffers[dtype] = torch.from_file(path, shared=True, size=n, dtype=getattr(torch, dtype))
        return self

    def unlink(self) -> None:
        """Delete the buffer files; existing mappings stay valid."""
        for path, _ in self.files.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def matches(self, state: Mapping[str, Tensor]) -> bool:
        """Whether ``state`` has exactly this layout's names, dtypes and shapes."""
        if state.keys() != self.layout.keys():
            return False
        return all(
            (str(t.dtype).removeprefix("torch."), tuple(t.shape)) == (self.layout[n][0], self.layout[n][2])
            for n, t in state.items()
        )

    @torch.no_grad()
    def write(self, state: Mapping[str, Tensor]) -> None:
        """Copy ``state`` (matching this layout) into the buffers."""
        for name, tensor in state.items():
            dtype, offset, _ = self.layout[name]
            self.buffers[dtype][offset : offset + tensor.numel()].copy_(tensor.detach().reshape(-1))

    def tensors(self) -> dict[str, Tensor]:
        """The state dict as views into the buffers (no copy)."""
        out = {}
        for name, (dtype, offset, shape) in self.layout.items():
            n = int(torch.Size(shape).numel())
            out[name] = self.buffers[dtype][offset : offset + n].view(shape)
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"files": self.files, "layout": self.layout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.files, self.layout, self.buffers = state["files"], state["layout"], {}
