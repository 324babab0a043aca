"""The few reductions a sharded `Trainer` needs across its ranks, behind one small protocol.

`LocalCollective` is one process (every reduction is the identity: the single-process trainer's arithmetic
is untouched); `ProcessGroupCollective` all-reduces over a torch.distributed process group (gloo on CPU,
NCCL on GPU). Every rank of the group must make the same calls in the same order, as with any collective.

Owns: the reductions. Does not own: the process group (its creator initialises and destroys it).
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Collective", "LocalCollective", "ProcessGroupCollective"]

Summable = TypeVar("Summable", float, Tensor)


@runtime_checkable
class Collective(Protocol):
    """Reductions over the ranks of one trainer. ``sum`` of a tensor returns a new tensor of the same shape,
    dtype and device (the input is never changed); of a float, a float. ``sum_floats`` sums a list
    element-wise in one reduction; ``max_int`` is the largest ``n`` over the ranks."""

    @property
    def world_size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    def sum(self, x: Summable) -> Summable: ...

    def sum_floats(self, xs: list[float]) -> list[float]: ...

    def max_int(self, n: int) -> int: ...


class LocalCollective:
    """One process: ``world_size`` 1, rank 0, every reduction returns its input."""

    world_size = 1
    rank = 0

    def sum(self, x: Summable) -> Summable:
        return x

    def sum_floats(self, xs: list[float]) -> list[float]:
        return list(xs)

    def max_int(self, n: int) -> int:
        return n


class ProcessGroupCollective:
    """All-reduces over ``group`` (default: the default group, which must be initialised).

    Floats and ints travel as float64 / int64 tensors on ``device`` (default: the current CUDA device for
    an NCCL group, else the CPU); a tensor is reduced on its own device, which must suit the backend."""

    def __init__(
        self, group: dist.ProcessGroup | None = None, device: torch.device | str | None = None
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ProcessGroupCollective needs torch.distributed to be initialised")
        self.group = group
        if device is None:
            nccl = dist.get_backend(group) == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self.device = torch.device(device)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    def sum(self, x: Summable) -> Summable:
        if isinstance(x, Tensor):
            out = x.detach().clone()
            dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
            return out
        out = torch.tensor(float(x), dtype=torch.float64, device=self.device)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return float(out)

    def sum_floats(self, xs: list[float]) -> list[float]:
        """Element-wise sums of a list of floats, in one all-reduce (float64)."""
        out = torch.tensor([float(x) for x in xs], dtype=torch.float64, device=self.device)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out.tolist()

    def max_int(self, n: int) -> int:
        out = torch.tensor(int(n), dtype=torch.int64, device=self.device)
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self.group)
        return int(out)
