"""Rewriting a config of the flat ``algo`` section (``algo.advantage: grpo``, ``algo.eps_low: 0.2``, ...)
into the typed one (``algo.advantage: {type: grpo}``, ``algo.loss: {eps_low: 0.2}``): `sao config --migrate`.

Each flat key goes where `MOVED_KEYS` says, into the estimator or the loss its type selects. A flat key the
selected class has no field for did nothing before (e.g. ``running_mean_window`` under the sao preset's
estimator); it is dropped and named in the notes when it differed from its old default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .algo import FLAT_DEFAULTS, MOVED_KEYS, AlgoConfig
from .unions import union_variants

__all__ = ["migrate_config"]


def migrate_config(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` (a config mapping) with its ``algo`` section in the typed shape, and notes on what was
    dropped. A config already in the typed shape comes back unchanged."""
    out = dict(data)
    algo = data.get("algo")
    if not isinstance(algo, Mapping) or (not any(k in MOVED_KEYS for k in algo) and not _named(algo)):
        return out, []
    flat = dict(algo)
    typed: dict[str, Any] = {k: v for k, v in flat.items() if k not in MOVED_KEYS and k not in ("advantage",)}
    sections: dict[str, dict[str, Any]] = {"advantage": {}, "loss": {}}
    if isinstance(flat.get("advantage"), str):
        sections["advantage"]["type"] = flat["advantage"]
    elif isinstance(flat.get("advantage"), Mapping):
        sections["advantage"] = dict(flat["advantage"])
    if isinstance(typed.get("loss"), Mapping):
        sections["loss"] = dict(typed.pop("loss"))
    notes = []
    for key, value in flat.items():
        moved = MOVED_KEYS.get(key)
        if moved is None:
            continue
        section, field = moved.split(".")
        if field == "type":
            sections[section]["type"] = value
            continue
        if _has_field(section, sections[section].get("type"), field):
            sections[section][field] = value
        elif value != FLAT_DEFAULTS.get(key):
            kind = sections[section].get("type", "the preset's")
            notes.append(f"algo.{key}={value!r} dropped: {kind} {section} has no {field} (it was ignored)")
    for section, values in sections.items():
        if values:
            typed[section] = values
    out["algo"] = typed
    return out, notes


def _named(algo: Mapping[str, Any]) -> bool:
    return isinstance(algo.get("advantage"), str) or isinstance(algo.get("loss"), str)


def _has_field(section: str, kind: str | None, field: str) -> bool:
    """Whether the class of ``type`` ``kind`` (None: any built-in) under ``algo.<section>`` has ``field``."""
    variants = union_variants(AlgoConfig, section) or {}
    if kind is None:
        return any(field in cls.model_fields for tag, cls in variants.items() if tag != "custom")
    cls = variants.get(kind)
    return cls is not None and field in cls.model_fields
