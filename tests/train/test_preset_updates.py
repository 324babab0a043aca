"""Every preset's update, recorded: the weights and loss numbers after two steps on fixed batches.

``tests/data/preset_updates.json`` was written (``SAO_RECORD_UPDATES=1``) before the algorithm configs became
typed classes, and the test holds every later version of the code to it: same preset, same batch, bitwise the
same actor and critic weights and the same loss metrics. On a machine whose CPU kernels differ from the
recording one (another ``torch.backends.cpu.get_cpu_capability()`` or torch version) float rounding may
differ, so there the weights are compared by their float sums to 1e-5 instead of by their bytes. The machine
is the torch version, torch's CPU capability and the CPU model with the ISA extensions that change rounding
(``_machine``): torch's "AVX512" alone names CPUs with and without AMX alike, whose bits differ.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from sao.presets import PRESETS
from sao.runtime.build import FACTORIES, build_trainer

from .test_step import _config, _models, _on_policy_batch, _trajectories

RECORD = Path(__file__).parents[1] / "data" / "preset_updates.json"
METRICS = ("actor/loss", "actor/grad_norm", "adv/mean", "adv/std", "critic/loss", "critic/grad_norm")
# Variants beyond the presets: non-default knobs of the loss and the estimator.
VARIANTS: dict[str, tuple[str, list[str]]] = {
    **{name: (name, []) for name in PRESETS},
    "sao+bootstrap+seq_sum": (
        "sao",
        ["algo.advantage.truncation=bootstrap", "algo.loss.agg=seq-mean-token-sum"],
    ),
    "grpo+no_std": ("grpo", ["algo.advantage.normalize_std=false"]),
}


def _digest(model: torch.nn.Module | None) -> dict[str, object] | None:
    if model is None:
        return None
    state = model.state_dict()
    sha = hashlib.sha256()
    for name in sorted(state):
        sha.update(name.encode())
        sha.update(state[name].detach().contiguous().cpu().numpy().tobytes())
    flat = torch.cat([state[n].detach().double().flatten() for n in sorted(state)])
    return {"sha256": sha.hexdigest(), "sum": float(flat.sum()), "abs_sum": float(flat.abs().sum())}


def _update(tiny_moe_dir: Path, variant: str) -> dict[str, object]:
    preset, extra = VARIANTS[variant]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one summation order
    try:
        cfg = _config(preset, *extra)
        torch.manual_seed(0)
        actor, critic = _models(tiny_moe_dir, cfg)
        trainer = build_trainer(FACTORIES["trainer"](cfg), actor, critic)
        steps = []
        for step in range(2):
            batch = _on_policy_batch(actor, _trajectories(seed=step), shift=0.3)
            metrics = trainer.train_step(batch, policy_version=step + 1)
            steps.append({k: float(metrics[k]) for k in METRICS if k in metrics})
    finally:
        torch.set_num_threads(threads)
    return {"actor": _digest(actor), "critic": _digest(critic), "metrics": steps}


def _machine() -> dict[str, str]:
    return {
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "cpu_model": _cpu_model(),
        "torch": torch.__version__.split("+")[0],
    }


def _cpu_model() -> str:
    """The CPU's vendor, family and model, and the ISA extensions whose kernels round differently (AMX,
    AVX-512 BF16/FP16): two CPUs torch calls "AVX512" alike need not produce the same bits. "unknown" off
    Linux."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    isa = [f for f in ("amx_tile", "amx_bf16", "avx512_bf16", "avx512_fp16") if f in flags]
    ids = [fields.get(key, "?") for key in ("vendor_id", "cpu family", "model")]
    return " ".join([*ids, *isa])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_preset_update_matches_the_recorded_one(variant, tiny_moe_dir):
    got = _update(tiny_moe_dir, variant)
    if os.environ.get("SAO_RECORD_UPDATES") == "1":
        data = json.loads(RECORD.read_text()) if RECORD.exists() else {"updates": {}}
        data["machine"] = _machine()  # a re-recording holds this machine's bits
        data["updates"][variant] = got
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    data = json.loads(RECORD.read_text())
    want = data["updates"][variant]
    exact = data["machine"] == _machine()
    assert got["metrics"] == want["metrics"] if exact else _close(got["metrics"], want["metrics"])
    for part in ("actor", "critic"):
        if want[part] is None:
            assert got[part] is None, part
        elif exact:
            assert got[part]["sha256"] == want[part]["sha256"], f"{variant}: {part} weights differ"
        else:
            for key in ("sum", "abs_sum"):
                assert got[part][key] == pytest.approx(want[part][key], rel=1e-5), (part, key)


def _close(got: list[dict[str, float]], want: list[dict[str, float]]) -> bool:
    return all(g.keys() == w.keys() and all(g[k] == pytest.approx(w[k], rel=1e-4, abs=1e-7) for k in w)
               for g, w in zip(got, want, strict=True))  # fmt: skip
