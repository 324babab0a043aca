"""Compiled CPU kernel for the GAE recursion along a chain of tokens (numba).

On CPU the sequential recursion is fastest as one pass per trajectory in compiled code (parallel over
trajectories); the blocked tensor scan in ``scan.py`` is the path for GPU tensors and the fallback where
numba is missing or disabled (``SAO_NUMBA=0``). Both are tested against the same reference loops.
The kernel is compiled on first use (about a second) and cached on disk by numba.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["STRAY_REWARD_MSG", "chain_gae_cpu", "numba_available"]

# numba's "workqueue" threading layer aborts the process on concurrent parallel launches; the async runtime
# may call GAE from more than one thread, so launches are serialised.
_LAUNCH_LOCK = threading.Lock()

STRAY_REWARD_MSG = "rewards must be 0 on non-action tokens (put the outcome on the last action token)"


@functools.cache
def _kernel() -> Callable[..., None] | None:
    if os.environ.get("SAO_NUMBA", "1") == "0":
        return None
    try:
        import numba
    except ImportError:
        return None
    # Left to itself numba prefers an OpenMP pool of one thread per core whose idle threads spin: a process
    # that set torch to 1 thread would burn a second core between GAE calls (measured: the trainer's step
    # used 2 cores and slowed a separate engine process). workqueue threads sleep; NUMBA_THREADING_LAYER
    # still overrides.
    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "workqueue"

    @numba.njit(parallel=True, cache=True, nogil=True)
    def chain_gae(
        rewards: Any,
        values: Any,
        chain: Any,
        keep: Any,
        cu: Any,
        decay: Any,
        tail: Any,
        gamma: float,
        adv: Any,
        ret: Any,
        stray_reward: Any,
    ) -> None:
        # Writes every position (adv/ret arrive uninitialised); flags a reward outside `keep` per row.
        # tail[b] is the value after the row's last chain token (0: terminal; V there: bootstrapped).
        for b in numba.prange(cu.shape[0] - 1):
            next_value = tail[b]
            running = 0.0
            d = decay[b]
            for t in range(cu[b + 1] - 1, cu[b] - 1, -1):
                if chain[t]:
                    running = rewards[t] + gamma * next_value - values[t] + d * running
                    next_value = values[t]
                if keep[t]:
                    adv[t] = running
                    ret[t] = running + next_value
                else:
                    adv[t] = 0.0
                    ret[t] = 0.0
                    if rewards[t] != 0.0:
                        stray_reward[b] = True

    return chain_gae


def numba_available() -> bool:
    """True when the compiled CPU kernel can be used."""
    return _kernel() is not None


def chain_gae_cpu(
    rewards: Tensor,
    values: Tensor,
    chain: Tensor,
    keep: Tensor,
    cu_seqlens: Tensor,
    gamma: float,
    lam: Tensor,
    tail: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE along the ``chain`` tokens of each trajectory, on CPU; see ``gae._chain_gae``.

    Inputs: ``rewards``/``values`` ``(T,)`` float, ``chain`` and ``keep`` ``(T,)`` bool (``keep`` ⊆
    ``chain``), ``cu_seqlens`` ``(B+1,)``, ``lam`` ``(B,)``, ``tail`` ``(B,)`` the next value after each
    trajectory's last chain token (None: 0 everywhere, the terminal case). Accumulates in float64. Returns
    ``(advantages, returns)`` ``(T,)`` in the dtype of ``values``, 0 off ``keep``. Requires
    :func:`numba_available`.
    """
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("the numba GAE kernel is not available (numba missing or SAO_NUMBA=0)")
    work = values.dtype if values.dtype in (torch.float32, torch.float64) else torch.float32  # numpy: no bf16
    adv = torch.empty(values.shape, dtype=work)
    ret = torch.empty_like(adv)
    num_seqs = cu_seqlens.numel() - 1
    stray = torch.zeros(num_seqs, dtype=torch.bool)
    tail = torch.zeros(num_seqs, dtype=work) if tail is None else tail.detach().to(work)
    args = (
        rewards.detach().to(work).contiguous().numpy(),
        values.detach().to(work).contiguous().numpy(),
        chain.contiguous().numpy(),
        keep.contiguous().numpy(),
        cu_seqlens.to(torch.int64).contiguous().numpy(),
        (gamma * lam).to(torch.float64).contiguous().numpy(),
        tail.contiguous().numpy(),
        float(gamma),
    )
    import numba

    with _LAUNCH_LOCK:
        # The caller's torch thread budget bounds the kernel's threads too (numba defaults to every core).
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
        kernel(*args, adv.numpy(), ret.numpy(), stray.numpy())
    if bool(stray.any()):
        raise ValueError(STRAY_REWARD_MSG)
    return adv.to(values.dtype), ret.to(values.dtype)
