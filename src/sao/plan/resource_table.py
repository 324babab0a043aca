"""The resource plan as rows and as a rich table: what `sao plan` prints and docs/paper_configs.md shows.

Each row is (quantity, value, how it is computed); `sao.plan.resources` computes the figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from sao.plan.memory import DTYPE_BYTES, activation_bytes_per_token

if TYPE_CHECKING:
    from sao.plan.resources import ResourcePlan

__all__ = ["format_resource_plan", "resource_rows"]

GIB = 1024**3


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}" if n % size else f"{n // size:g} {unit}"
    return f"{n:g} B"


def _count(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return str(n)


def _n(count: float, noun: str) -> str:
    return f"{count:g} {noun}" + ("" if count == 1 else "s")


def _engine_rows(plan: ResourcePlan) -> list[tuple[str, str, str]]:
    a, gpu, dtype = plan.architecture, f"{plan.gpu_memory_gib:g} GiB", plan.engine_dtype
    kv = f"2 × {a.num_layers} layers × {a.num_kv_heads} KV heads × {a.head_dim} head dim × "
    rows = [
        ("engine dtype", dtype, "engine.dtype; each push casts the trainer's weights to it"),
        ("KV cache per token", _bytes(plan.kv_bytes_per_token), kv + f"{DTYPE_BYTES[dtype]} B"),
        ("KV per full sequence", _bytes(plan.kv_bytes_per_sequence),
         f"data.max_total_tokens = {plan.max_total_tokens:,} tokens"),
        ("weights per replica", _bytes(plan.weight_bytes), f"all parameters in {dtype}"),
    ]  # fmt: skip
    if plan.sequences_per_replica is None:
        rows.append(("full sequences per replica", "–", "engines without GPUs of their own"))
    else:
        budget = f"({plan.gpus_per_engine_replica:g} × {gpu} × {plan.engine_memory_fraction:g} − weights)"
        every = str(plan.sequences_per_replica * plan.engine_replicas)
        how = f"{budget} / KV per full sequence"
        rows.append(("full sequences per replica", str(plan.sequences_per_replica), how))
        rows.append(("full sequences, all replicas", every, f"runtime.max_in_flight = {plan.max_in_flight}"))
    pushes = f"{plan.weight_sync}, to {_n(plan.engine_replicas, 'replica')} after every actor step"
    rows.append(("weight sync per push", _bytes(plan.weight_bytes), pushes))
    return rows


def _trainer_rows(plan: ResourcePlan) -> list[tuple[str, str, str]]:
    gpu, master = f"{plan.gpu_memory_gib:g} GiB", plan.master_dtype
    m = DTYPE_BYTES[master]
    critic = "no critic"
    if plan.critic_params:
        critic = f"critic {_count(plan.critic_params)} ({_count(plan.critic_trainable_params)} trainable)"
    state = (f"actor {_count(plan.params_total)}, {critic}: {4 * m} B per trainable parameter ({master} "
             f"weight, gradient, AdamW m and v), {m} B frozen")  # fmt: skip
    precision = f"compute {plan.compute_dtype}, master {master}"
    rows = [
        ("trainer precision", precision, "model.dtype, model.master_dtype"),
        ("trainer state", _bytes(plan.trainer_state_bytes), state),
    ]
    mem, peak = plan.trainer_memory, plan.trainer_peak_bytes_per_gpu
    if plan.trainer_state_bytes_per_gpu is None or mem is None or peak is None:
        return [*rows, ("trainer state per GPU", "–", "trainer on CPU")]
    share = f"{_bytes(plan.trainer_state_bytes_per_gpu)} of {gpu}"
    over = "one process" if plan.runtime_backend == "local" else f"FSDP over {plan.trainer_gpus:g} GPUs"
    rows.append(("trainer state per GPU", share, over))
    ckpt_on = plan.gradient_checkpointing
    kept, working = activation_bytes_per_token(plan.architecture, plan.compute_dtype, ckpt_on)
    ckpt = "on" if ckpt_on else "off"
    activations = _bytes(mem.activations_kept + max(mem.activations_working, mem.lm_head_chunk))
    how = (f"{plan.micro_batch_tokens:,} tokens (max of trainer.micro_batch_tokens, data.max_total_tokens);"
           f" checkpointing {ckpt}: {kept:,} B/token kept + {working:,} B/token in backward's layer, or the"
           f" LM head's chunk {_bytes(mem.lm_head_chunk)}")  # fmt: skip
    rows.append(("activations per GPU", activations, how))
    if mem.gathered:
        units = f"FSDP units in {plan.compute_dtype}: root + 2 layers, and unsharded gradients"
        if plan.unsharded_gradient:
            units += "; a full unsharded gradient (trainer.gradient_sync: step, several micro-batches a rank)"
        rows.append(("gathered parameters", _bytes(mem.gathered), units))
    if mem.engine:
        kv = f" + KV {_bytes(mem.engine_kv)} (async rollouts)" if mem.engine_kv else ""
        weights = f"weights {_bytes(mem.engine_weights)}{kv}"
        rows.append(("engine on the trainer GPU", _bytes(mem.engine), weights))
    left = plan.trainer_headroom_bytes
    verdict = f"{_bytes(left)} left" if left is not None and left > 0 else "DOES NOT FIT"
    rows.append(("trainer peak per GPU", f"{_bytes(peak)} of {gpu}", f"sao.plan.memory; {verdict}"))
    return rows


def resource_rows(plan: ResourcePlan) -> list[tuple[str, str, str]]:
    """The plan as (quantity, value, how it is computed) rows, in the order `format_resource_plan` shows."""
    a = plan.architecture
    moe = f"{a.num_experts} experts, top-{a.experts_per_token}; " if a.num_experts else ""
    head = "tied embeddings" if a.tie_word_embeddings else "embeddings and LM head"
    layout = f"trainer {plan.trainer_gpus:g} + engines {plan.engine_gpus:g}"
    if plan.runtime_backend == "local":
        layout = "local runtime: trainer and engine share " + ("one GPU" if plan.total_gpus else "the CPU")
    rows = [
        ("model", f"{plan.model} ({a.model_type})", plan.architecture_source),
        ("parameters", f"{_count(plan.params_total)} total, {_count(plan.params_active)} active",
         f"{moe}{head} included"),
        ("GPUs", f"{plan.total_gpus:g}", layout),
        ("trainer GPUs", f"{plan.trainer_gpus:g}",
         f"{_n(plan.trainer_workers, 'worker')} × {_n(plan.gpus_per_trainer_worker, 'GPU')}"),
        ("engine GPUs", f"{plan.engine_gpus:g}",
         f"{_n(plan.engine_replicas, 'replica')} × {_n(plan.gpus_per_engine_replica, 'GPU')}"),
    ]  # fmt: skip
    rows += _engine_rows(plan) + _trainer_rows(plan)
    return rows + [("note", "", note) for note in plan.notes]


def format_resource_plan(plan: ResourcePlan) -> Table:
    """The plan as a rich table (quantity, value, how it is computed)."""
    table = Table(title=f"Resource plan: {plan.model}", title_justify="left")
    for column in ("quantity", "value", "how"):
        table.add_column(column, overflow="fold")
    for row in resource_rows(plan):
        table.add_row(*row)
    return table
