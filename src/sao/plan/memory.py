"""Predicted GPU memory of one trainer GPU during one training micro-batch: a formula, not a measurement.

Arithmetic on the architecture (`sao.plan.architecture`) and the trainer's settings, as the code holds them
(no torch). ``c`` is the bytes of the compute dtype (``model.dtype``), ``m`` of the master dtype
(``model.master_dtype``); ``T`` tokens in the micro-batch; ``H`` hidden, ``I`` MLP width, ``a`` / ``g``
query / KV heads of ``d`` dims, ``V`` vocabulary, ``L`` layers (MoE: ``E`` experts, top-``k``, width
``M``); ``W`` trainer GPUs the state is sharded over (FSDP2).

**State** (`state_bytes_per_parameter`), sharded over W, for the actor and the critic: a trainable
parameter holds its weight, gradient and AdamW's two moments in the master dtype (``4m``: 16 B fp32
master, 8 B pure bf16; torch's AdamW keeps its moments in the parameter's dtype); a frozen one its weight
(``m``). The critic's gradients stay allocated through the actor phase (the trainer frees them only at the
next critic step), so both models' states are counted at once.

**Compute copies of the weights** when ``c != m`` or the state is sharded (`_weight_copies`):

- FSDP2 (the Ray backend's ranks; ``MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=master)``,
  `sao.models.precision.fsdp_policy`): the actor's root unit (embeddings, final norm, an untied LM head)
  gathered in the compute dtype from forward to the end of backward (`sao.models.sharding`) and its
  unsharded gradient; two decoder layers gathered (the one running and the one prefetched); one layer's
  unsharded gradient in the compute dtype and its master-dtype copy for the reduce-scatter;
- one process (the local runtime, `sao.models.precision.cast_for_compute`): each module swaps in
  compute-dtype copies while it runs. With checkpointing only the layer being recomputed has them: its
  copies, their gradients and those gradients cast to the master dtype (``layer·(2c + m)``) join backward's
  working set; without, every layer's copies stay saved until backward (``Σ layers·c``). The LM head's
  chunks are always recomputed: its copy, gradient and master-dtype gradient ``V·H·(2c + m)`` join the
  chunk's working set;
- one process, one dtype: no copy; the head's per-chunk weight gradient ``V·H·c`` before it is added;
- FSDP2 with one gradient reduce per step (``trainer.gradient_sync: step``) and more than one micro-batch
  per rank: a full unsharded gradient in the reduce dtype (``max(c, m)`` per trainable parameter of the
  model being stepped) from the first backward to the step (`sao.train.step`).

**Activations** per token, the tensors autograd saves in transformers' Qwen3 decoder layer under sao's
packed attention (per-trajectory SDPA; flash / memory-efficient kernels keep only q, k, v, the output and
the log-sum-exp) — `layer_activation_bytes_per_token`, checked against ``saved_tensors_hooks`` on CPU:

- each RMSNorm of width w: its fp32 upcast ``4w``, ``rsqrt`` 4 B per row, the normalised input ``c·w``;
  input norm (w = H), post-attention norm (H), q-norm (w = d, a rows), k-norm (d, g rows);
- the attention block: the norm's output (the q/k/v projections' input) ``cH``; q after RoPE ``c·a·d``, k and
  v ``c·g'·d`` each (g' = g: the kernel takes GQA natively in bf16 / fp16; g' = a in fp32, where K/V are
  expanded to every query head first); the SDPA output ``c·a·d`` and its fp32 log-sum-exp ``4a``; the o-proj
  input ``c·a·d`` (the transposed copy);
- a dense MLP: the norm's output ``cH``, gate, SiLU(gate), up and their product ``4cI``;
- a MoE MLP: the norm's output ``cH``, the router's fp32 probabilities ``4E`` and top-k bookkeeping
  ``16k``; per routed copy (k per token) the gathered input and the weighted output ``2cH``, gate-up,
  SiLU and product ``4cM``, and the routing weight and indices (``c + 16``).

Dense layer: ``(8 + 4c)H + 8 + (4 + c)(a + g)d + 4(a + g) + 3c·a·d + 2c·g'·d + 4a + 4cI`` bytes per token.
Outside the layers (`outside_layers_bytes_per_token`): the final norm ``(4 + c)H + 4``, the hidden rows the LM
head reads ``cH``, RoPE's cos and sin ``2cd`` (shared by every layer) and three index vectors ``24``.

With activation checkpointing (one checkpoint per decoder layer) only each layer's input ``cH`` is kept and
backward recomputes one layer at a time: kept ``T·(L·cH + outside)``, working ``T·layer`` (the recomputed
set; its gradients in flight replace the saved tensors they consume). Without: kept ``T·(Σ layers +
outside)``, working ``4cH·T`` (the residual stream's gradients in flight). Measured on CPU with the
profiler's allocation trace (bf16, 4 layers, 8k tokens): working 0.9× the recomputed layer with
checkpointing, 0.8–1.0× ``4cH·T`` without; tests/plan/test_memory.py holds the whole backward's peak of
Qwen3 and Qwen3-MoE shapes, fp32-master and pure bf16, with and without checkpointing, within 15 % of
this model.

**LM head**: `sao.models.forward.token_logprobs` runs it over ``LM_HEAD_CHUNK_TOKENS`` rows at a time under
checkpointing, so at most one chunk of ``(rows, V)`` logits lives, in its backward: the fp32 logits and
softmax (entropy) and two fp32 gradient temporaries, ``16`` B per logit (measured on CPU: 15.0 in fp32,
15.5 in bf16), plus the head weight's copies above.

**Optimizer step**: AdamW's foreach step allocates ``sqrt(v)`` for every trainable parameter of the model
it steps (``m`` B each, on the shard), after backward has freed the activations.

**Engine** (the local runtime, whose engine shares the trainer's GPU): its weights in the engine dtype, and
its KV cache when rollouts run during training (asynchronous mode; the local engine frees its cache when
idle, so a synchronous run's trainer never meets it).

Peak = state + engine + max(gathered + kept + max(LM-head chunk, working), optimizer step), where
gathered is the copies held through backward and the chunk and the working set carry their own. Not counted:
the CUDA context, allocator fragmentation and cached blocks, NCCL buffers (what
``torch.cuda.max_memory_allocated`` does not count either), the no-grad forwards (smaller than the
training one), logits divided by a temperature other than 1 (one more fp32 ``(rows, V)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao.plan.architecture import (
    Architecture,
    critic_parameter_sizes,
    known_config,
    layer_parameter_counts,
    parameter_sizes,
)

__all__ = [
    "DTYPE_BYTES",
    "LM_HEAD_CHUNK_TOKENS",
    "TrainerMemory",
    "activation_bytes_per_token",
    "as_architecture",
    "layer_activation_bytes_per_token",
    "lm_head_chunk_bytes",
    "local_engine_kv_bytes",
    "outside_layers_bytes_per_token",
    "predicted_trainer_peak_bytes",
    "state_bytes_per_parameter",
    "trainer_memory",
]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LM_HEAD_CHUNK_TOKENS = 1024  # sao.models.forward.token_logprobs' chunk_tokens default
_LOCAL_ENGINE_MAX_KV = 65536  # LocalEngine's max_kv_tokens default: its context limit at most
_KV_MIN_CAPACITY = 64  # sao.engine.kv_cache's first capacity
_LOGIT_BYTES = 16  # fp32 logits, softmax, two fp32 gradient temporaries (module docstring)


def _bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; choose {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def state_bytes_per_parameter(master: str, trainable: bool = True) -> int:
    """Bytes a parameter holds between steps: weight, gradient and AdamW's m and v in ``master``
    (``4m``: 16 for float32, 8 for bfloat16) when trainable, the weight alone (``m``) when frozen."""
    return (4 if trainable else 1) * _bytes(master)


def _norm(width: int, rows: int, c: int) -> int:
    """Saved by one RMSNorm over ``rows`` rows of ``width``: fp32 upcast, rsqrt per row, normalised input."""
    return rows * ((4 + c) * width + 4)


def layer_activation_bytes_per_token(arch: Architecture, layer: int, compute: str) -> int:
    """Bytes autograd saves per token in decoder layer ``layer`` for backward (module docstring's terms)."""
    c = _bytes(compute)
    h, a, g, d = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim
    kv_saved = g if c < 4 else a  # fp32: K/V expanded to every query head for the efficient kernel
    attention = (
        _norm(h, 1, c) + c * h  # input norm, its output (q/k/v input)
        + _norm(d, a, c) + _norm(d, g, c)  # q-norm, k-norm
        + c * a * d + 2 * c * kv_saved * d  # q after RoPE, k, v (SDPA inputs)
        + c * a * d + 4 * a  # SDPA output and log-sum-exp
        + c * a * d  # o-proj input
    )  # fmt: skip
    if arch.is_sparse(layer):
        k, m, e = arch.experts_per_token, arch.moe_intermediate_size, arch.num_experts
        mlp = _norm(h, 1, c) + c * h + 4 * e + 16 * k + k * (2 * c * h + 4 * c * m + c + 16)
    else:
        mlp = _norm(h, 1, c) + c * h + 4 * c * arch.intermediate_size
    return attention + mlp


def outside_layers_bytes_per_token(arch: Architecture, compute: str) -> int:
    """Saved per token outside the decoder layers: final norm, the LM head's input rows, RoPE cos/sin,
    index vectors."""
    c = _bytes(compute)
    return _norm(arch.hidden_size, 1, c) + c * arch.hidden_size + 2 * c * arch.head_dim + 24


def activation_bytes_per_token(arch: Architecture, compute: str, checkpointing: bool) -> tuple[int, int]:
    """``(kept, working)`` bytes per token: what stays saved through the forward, and what backward adds on
    top for the layer it is in (module docstring)."""
    c = _bytes(compute)
    layers = [layer_activation_bytes_per_token(arch, i, compute) for i in range(arch.num_layers)]
    outside = outside_layers_bytes_per_token(arch, compute)
    if checkpointing:
        return arch.num_layers * c * arch.hidden_size + outside, max(layers)
    return sum(layers) + outside, 4 * c * arch.hidden_size


def lm_head_chunk_bytes(arch: Architecture, tokens: int, compute: str, head_weight_bytes: int = 0) -> int:
    """Peak bytes of one LM-head chunk's backward: ``min(tokens, LM_HEAD_CHUNK_TOKENS)`` rows of ``V``
    logits at 16 B each, plus ``head_weight_bytes`` per head parameter (its compute copy and gradients;
    `_weight_copies`)."""
    rows = min(tokens, LM_HEAD_CHUNK_TOKENS)
    return rows * arch.vocab_size * _LOGIT_BYTES + arch.vocab_size * arch.hidden_size * head_weight_bytes


def _weight_copies(
    arch: Architecture, c: int, m: int, checkpointing: bool, sharded: bool
) -> tuple[int, int, int]:
    """``(held, per layer in backward, per head parameter)`` bytes of compute copies of the weights and
    their unsharded gradients (module docstring)."""
    layers = layer_parameter_counts(parameter_sizes(arch))
    layer = max(layers)
    if sharded:
        root = sum(parameter_sizes(arch).values()) - sum(layers)
        return 2 * root * c + 2 * layer * c + layer * (c + (m if m != c else 0)), 0, c
    if c == m:
        return 0, 0, c
    if checkpointing:
        return 0, layer * (2 * c + m), 2 * c + m
    return sum(layers) * c, layer * (c + m), 2 * c + m


def local_engine_kv_bytes(arch: Architecture, dtype: str, slots: int, longest: int) -> int:
    """KV cache of sao's `LocalEngine` once a sequence of ``longest`` tokens (prompt + reply, at most
    ``data.max_total_tokens``) has run: ``slots`` (``engine.max_concurrent``) rows per layer, each as long
    as the capacity, which doubles from 64 up to ``longest`` and stops at the context limit
    (``min(max_position_embeddings, 65536)``; `sao.engine.kv_cache.SlotKVCache`)."""
    limit = min(arch.max_position_embeddings or _LOCAL_ENGINE_MAX_KV, _LOCAL_ENGINE_MAX_KV)
    capacity = _KV_MIN_CAPACITY
    while capacity < longest:
        capacity *= 2
    return arch.kv_bytes_per_token(_bytes(dtype)) * slots * min(capacity, limit)


@dataclass(frozen=True)
class TrainerMemory:
    """Bytes on one trainer GPU at the peak of one micro-batch, by term (module docstring)."""

    tokens: int
    state: int  # the GPU's shard of both models' weights, gradients and AdamW moments
    gathered: int  # compute copies of the weights (and unsharded gradients) held through backward
    activations_kept: int
    activations_working: int  # backward's layer: recomputed activations, gradients, its weight copies
    lm_head_chunk: int  # one chunk's logits and the head weight's copies
    optimizer_step: int  # AdamW's foreach temporary, after backward
    engine_weights: int = 0
    engine_kv: int = 0

    @property
    def compute_peak(self) -> int:
        """During the actor's backward."""
        working = max(self.lm_head_chunk, self.activations_working)
        return self.state + self.engine + self.gathered + self.activations_kept + working

    @property
    def engine(self) -> int:
        return self.engine_weights + self.engine_kv

    @property
    def peak(self) -> int:
        """The larger of the backward's peak and the optimizer step's."""
        return max(self.compute_peak, self.state + self.engine + self.optimizer_step)


def trainer_memory(
    arch: Architecture,
    tokens: int,
    *,
    compute: str = "bfloat16",
    master: str = "float32",
    checkpointing: bool = True,
    world: int = 1,
    sharded: bool | None = None,
    unsharded_gradient: bool = False,
    critic_trainable: int = 0,
    critic_frozen: int = 0,
    engine_weights: int = 0,
    engine_kv: int = 0,
) -> TrainerMemory:
    """The memory of one trainer GPU (of ``world``) training the actor of ``arch`` on a micro-batch of
    ``tokens`` tokens, beside a critic of ``critic_trainable`` + ``critic_frozen`` parameters (0: none) and,
    for the local runtime, an engine holding ``engine_weights`` and ``engine_kv`` bytes on the same GPU.
    ``sharded``: FSDP2 ranks (None: ``world > 1``); else one process (`cast_for_compute` when mixed).
    ``unsharded_gradient``: FSDP2 ranks accumulate a full unsharded gradient in the reduce dtype across
    their micro-batches (``trainer.gradient_sync: step`` with more than one micro-batch per rank)."""
    if tokens < 1 or world < 1:
        raise ValueError(f"tokens and world must be >= 1, got {tokens} and {world}")
    c, m = _bytes(compute), _bytes(master)
    params = sum(parameter_sizes(arch).values())
    state = params * state_bytes_per_parameter(master)
    state += critic_trainable * state_bytes_per_parameter(master) + critic_frozen * m
    is_sharded = world > 1 if sharded is None else sharded
    held, layer_copies, head_copies = _weight_copies(arch, c, m, checkpointing, is_sharded)
    if is_sharded and unsharded_gradient:  # the larger of the two models stepped, in the reduce dtype
        held += max(params, critic_trainable) * max(c, m)
    kept, working = activation_bytes_per_token(arch, compute, checkpointing)
    return TrainerMemory(
        tokens=tokens,
        state=math.ceil(state / world),
        gathered=held,
        activations_kept=tokens * kept,
        activations_working=tokens * working + layer_copies,
        lm_head_chunk=lm_head_chunk_bytes(arch, tokens, compute, head_copies),
        optimizer_step=math.ceil(max(params, critic_trainable) * m / world),
        engine_weights=engine_weights,
        engine_kv=engine_kv,
    )


def as_architecture(arch_or_config: Architecture | Mapping[str, Any] | str | Path) -> Architecture:
    """An `Architecture` from itself, a config.json mapping, a checkpoint directory (its config.json), or
    a name of `KNOWN_ARCHITECTURES` (``Qwen/Qwen3-0.6B``, ``qwen3-0.6b``). Raises ValueError otherwise."""
    if isinstance(arch_or_config, Architecture):
        return arch_or_config
    if isinstance(arch_or_config, Mapping):
        return Architecture.from_hf_config(arch_or_config)
    config_file = Path(arch_or_config) / "config.json"
    if config_file.is_file():
        import json

        return Architecture.from_hf_config(json.loads(config_file.read_text()))
    known = known_config(str(arch_or_config))
    if known is None:
        raise ValueError(
            f"{str(arch_or_config)!r} is neither a checkpoint directory nor a known architecture"
        )
    return Architecture.from_hf_config(known[1])


def predicted_trainer_peak_bytes(
    arch_or_config: Architecture | Mapping[str, Any] | str | Path,
    tokens: int,
    compute: str = "bfloat16",
    master: str = "float32",
    checkpointing: bool = True,
    world: int = 1,
    *,
    sharded: bool | None = None,
    unsharded_gradient: bool = False,
    critic: bool = False,
    critic_freeze_attention: bool = True,
    engine_dtype: str | None = None,
    engine_kv_bytes: int = 0,
) -> int:
    """Predicted peak bytes on one trainer GPU for one micro-batch of ``tokens`` tokens (`trainer_memory`'s
    ``peak``). ``critic``: a critic of the same backbone trains beside the actor (its attention frozen when
    ``critic_freeze_attention``, as ``critic.freeze: attention``); ``engine_dtype``: a local engine holds
    the weights in that dtype on the same GPU, plus ``engine_kv_bytes`` of KV cache; ``sharded`` and
    ``unsharded_gradient`` as `trainer_memory`."""
    arch = as_architecture(arch_or_config)
    trainable = frozen = 0
    if critic:
        sizes = critic_parameter_sizes(arch)
        frozen = sum(s for n, s in sizes.items() if critic_freeze_attention and ".self_attn." in n)
        trainable = sum(sizes.values()) - frozen
    engine = 0 if engine_dtype is None else sum(parameter_sizes(arch).values()) * _bytes(engine_dtype)
    memory = trainer_memory(
        arch, tokens, compute=compute, master=master, checkpointing=checkpointing, world=world,
        sharded=sharded, unsharded_gradient=unsharded_gradient, critic_trainable=trainable,
        critic_frozen=frozen, engine_weights=engine, engine_kv=engine_kv_bytes,
    )  # fmt: skip
    return memory.peak
