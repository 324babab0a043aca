"""Sections chosen by ``type``: the discriminated unions of the config schema (``algo.advantage``,
``algo.loss``), found by walking the pydantic models."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

__all__ = ["union_paths", "union_variants"]


def union_variants(model: type[BaseModel], field: str) -> dict[str, type[BaseModel]] | None:
    """``{type tag: class}`` when ``model.field`` is a union chosen by ``type``, else None."""
    info = model.model_fields.get(field)
    if info is None or info.discriminator != "type":
        return None
    members = typing.get_args(info.annotation)
    return {_tag(cls): cls for cls in members if isinstance(cls, type) and issubclass(cls, BaseModel)}


def _tag(cls: type[BaseModel]) -> str:
    (tag,) = typing.get_args(cls.model_fields["type"].annotation)
    return str(tag)


def union_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every path (tuple of keys) below ``model`` that is a union chosen by ``type``."""
    found: set[tuple[str, ...]] = set()
    for name, info in model.model_fields.items():
        here = (*prefix, name)
        if union_variants(model, name) is not None:
            found.add(here)
            continue
        sub: Any = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            found |= union_paths(sub, here)
    return found
