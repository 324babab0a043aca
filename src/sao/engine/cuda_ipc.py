"""Colocated weight hand-off on one GPU: CUDA IPC handles instead of copies.

When the trainer and an engine share a GPU (colocated), the new weights need not leave the device: the
trainer process exports each CUDA tensor as an IPC handle (`share_state`, torch's own tensor reduction,
the one `torch.multiprocessing` uses), the handles (a few hundred bytes per tensor) travel to the engine
process by any channel (a pipe, Ray's object store), and the engine maps them (`open_shared_state`) and
copies them into its own weights (`LocalEngine.update_weights`): one device-to-device copy, no host trip.

Lifetime: the mapped tensors alias the trainer's memory. The trainer must keep the shared tensors alive,
unmodified, until every engine has finished its copy (an `update_weights` call returns after the copy);
`share_state` therefore takes a snapshot (``clone``) by default, so that the trainer's next optimizer step
cannot change what an engine is still reading. CPU tensors are passed through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

__all__ = ["open_shared_state", "share_state"]


def share_state(state: Mapping[str, Tensor], *, snapshot: bool = True) -> tuple[dict[str, Any], list[Tensor]]:
    """``(handles, keep_alive)``: picklable IPC handles of the CUDA tensors in ``state`` (CPU tensors as
    they are), and the tensors the caller must keep referenced until every receiver has copied them."""
    from torch.multiprocessing.reductions import reduce_tensor

    handles: dict[str, Any] = {}
    keep: list[Tensor] = []
    for name, tensor in state.items():
        t = tensor.detach()
        if t.is_cuda:
            if snapshot:
                t = t.clone()
            keep.append(t)
            handles[name] = ("cuda", reduce_tensor(t))
        else:
            handles[name] = ("cpu", t)
    return handles, keep


def open_shared_state(handles: Mapping[str, Any]) -> dict[str, Tensor]:
    """The tensors behind `share_state`'s handles, mapped into this process (same device, no copy)."""
    out: dict[str, Tensor] = {}
    for name, (kind, payload) in handles.items():
        if kind == "cuda":
            rebuild, args = payload
            out[name] = rebuild(*args)
        elif kind == "cpu":
            out[name] = payload
        else:
            raise ValueError(f"{name!r}: unknown shared tensor kind {kind!r}")
    return out
