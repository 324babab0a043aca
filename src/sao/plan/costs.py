"""The stage constants of the model: what an engine step, a trainer step and a weight push cost.

* `EngineCosts` — one step of one engine replica advances each of its ``B`` active sequences by one token
  and takes ``t0 + t1·B + c·(sum of the B sequences' context tokens) + p·(prefill tokens admitted)``
  seconds (``t0`` s/step, ``t1`` s per sequence per step, ``c`` s per context token per step, ``p`` s
  per prefill token).
* `TrainerCosts` — a step on a batch of ``tokens`` tokens (prompt, replies and observations of all its
  trajectories) takes ``(a + b·tokens)·(1 + critic_step_factor·critic_steps)`` seconds at the
  ``workers`` it was measured with; on ``W`` workers the rate is scaled by
  ``speedup(W) / speedup(workers)`` with ``speedup(W) = 1 + scaling_eff·(W − 1)`` (linear when
  ``scaling_eff = 1``). A calibrated ``a``/``b`` already contains the preset's K critic steps
  (``critic_step_factor`` stays 0); the factor is for parametric what-ifs.
* ``push_s`` — seconds of one weight push after a trainer step; no engine steps meanwhile.

`StageCosts` bundles the three with a ``source`` line (a calibration file, a named profile, flags) and
reads/writes the calibration JSON (`sao plan --calibrate` writes it, ``--calibration`` reads it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CALIBRATION_KIND", "CostsError", "EngineCosts", "StageCosts", "TrainerCosts"]

CALIBRATION_KIND = "sao.plan.calibration"


class CostsError(ValueError):
    """A calibration file that cannot be read or has a bad value; the message names the file and key."""


@dataclass(frozen=True)
class EngineCosts:
    t0_s: float
    t1_s: float = 0.0
    c_s: float = 0.0
    p_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value >= 0:
                raise ValueError(f"engine cost {name} must be >= 0, got {value}")
        if self.t0_s + self.t1_s + self.c_s <= 0:
            raise ValueError("engine costs: a decode step must cost something (t0_s, t1_s or c_s > 0)")

    def step_s(self, running: int, context_tokens: float, prefill_tokens: float = 0.0) -> float:
        """Seconds of one step with ``running`` sequences holding ``context_tokens`` in all."""
        return self.t0_s + self.t1_s * running + self.c_s * context_tokens + self.p_s * prefill_tokens


@dataclass(frozen=True)
class TrainerCosts:
    a_s: float
    b_s: float
    workers: int = 1
    scaling_eff: float = 1.0
    critic_steps: int = 0
    critic_step_factor: float = 0.0

    def __post_init__(self) -> None:
        if self.a_s < 0 or self.b_s < 0 or self.a_s + self.b_s <= 0:
            raise ValueError(f"trainer costs: a_s, b_s >= 0 and not both 0, got {self.a_s}, {self.b_s}")
        if self.workers < 1 or not 0 < self.scaling_eff <= 1 or self.critic_step_factor < 0:
            raise ValueError(f"trainer costs: workers >= 1, 0 < scaling_eff <= 1, factor >= 0: {self}")

    @staticmethod
    def speedup(workers: int, scaling_eff: float) -> float:
        return 1.0 + scaling_eff * (workers - 1)

    def step_s(self, tokens: float, workers: int | None = None) -> float:
        """Seconds of a step on ``tokens`` tokens with ``workers`` workers (default: the measured ones)."""
        w = self.workers if workers is None else workers
        scale = self.speedup(self.workers, self.scaling_eff) / self.speedup(w, self.scaling_eff)
        return (self.a_s + self.b_s * tokens) * (1 + self.critic_step_factor * self.critic_steps) * scale


@dataclass(frozen=True)
class StageCosts:
    engine: EngineCosts
    trainer: TrainerCosts
    push_s: float = 0.0
    source: str = "explicit"
    fit: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": CALIBRATION_KIND,
            "source": self.source,
            "engine": asdict(self.engine),
            "trainer": asdict(self.trainer),
            "push_s": self.push_s,
            "fit": self.fit,
        }

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def from_json(cls, data: Any, where: str = "calibration") -> StageCosts:
        if not isinstance(data, dict) or data.get("kind") != CALIBRATION_KIND:
            raise CostsError(f'{where}: not a calibration file (expected "kind": "{CALIBRATION_KIND}")')
        try:
            engine = EngineCosts(**data["engine"])
            trainer = TrainerCosts(**data["trainer"])
            push_s = float(data.get("push_s", 0.0))
        except KeyError as err:
            raise CostsError(f"{where}: missing key {err}") from None
        except (TypeError, ValueError) as err:
            raise CostsError(f"{where}: {err}") from None
        if push_s < 0:
            raise CostsError(f"{where}: push_s must be >= 0, got {push_s}")
        return cls(engine, trainer, push_s, str(data.get("source", where)), dict(data.get("fit") or {}))

    @classmethod
    def read(cls, path: str | Path) -> StageCosts:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise CostsError(f"{path}: no such file") from None
        except json.JSONDecodeError as err:
            raise CostsError(f"{path}: invalid JSON: {err.msg} at line {err.lineno}") from None
        return cls.from_json(data, str(path))
