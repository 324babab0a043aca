"""Run keys that outlive the algorithm section's new shape.

`sao.sweep.spec.run_key` identifies a run by the non-default values of its config. The ``algo`` section used
to be flat (``algo.advantage: grpo``, ``algo.eps_low: 0.2``, ...); it is now typed (``algo.advantage: {type:
grpo}``, ``algo.loss: {eps_low: 0.2}``). So that finished sweep runs stay found, the key is computed on the
flat spelling: the typed section is flattened back to the old names and compared with the old defaults.
"""

from __future__ import annotations

from typing import Any

from sao.config.algo import FLAT_DEFAULTS, MOVED_KEYS

__all__ = ["legacy_algo"]

_OLD_NAME = {new: old for old, new in MOVED_KEYS.items()}


def legacy_algo(algo: dict[str, Any]) -> dict[str, Any]:
    """The flat section's non-default values for the fully dumped typed ``algo`` section ``algo``.

    A ``custom`` estimator or loss (new: it had no flat spelling) keeps its section as it is."""
    flat: dict[str, Any] = {}
    for section, type_key in (("advantage", "advantage"), ("loss", "policy_loss")):
        part = dict(algo.get(section, {}))
        if part.get("type") == "custom":
            flat[section] = part
            continue
        flat[type_key] = part.pop("type", None)
        for key, value in part.items():
            flat[_OLD_NAME.get(f"{section}.{key}", f"{section}.{key}")] = value
    flat.update({k: v for k, v in algo.items() if k not in ("advantage", "loss")})
    return {k: v for k, v in flat.items() if k not in FLAT_DEFAULTS or FLAT_DEFAULTS[k] != v}
