"""The config schema as documentation: every key of a pydantic config model with its type, default,
description and (given a loaded config) its value, as a tree that `sao config --explain` and
`sao config --reference` render (`sao.cli.explain`).

The walk is generic over `model_fields`: a field whose type is a pydantic model is a `Section`; a union of
pydantic models told apart by a `Literal` tag field (pydantic's discriminated union,
``Annotated[A | B, Field(discriminator="type")]``) is a `Choice` of variant sections, each with its own
fields; anything else is a `Leaf`. Nothing here names a config key.
"""

from __future__ import annotations

import difflib
import inspect
import math
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Discriminator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

REQUIRED = "required"
_CONSTRAINTS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "len >="))


@dataclass(frozen=True)
class Leaf:
    """One settable key. ``default``/``value`` are YAML text; ``value`` is None where no config was given or
    the key belongs to a variant the config did not select."""

    key: str
    type: str
    default: str
    description: str
    value: str | None = None


@dataclass(frozen=True)
class Section:
    """A pydantic model: the root (``key`` ""), a section, or one variant of a `Choice` (``tag`` its type
    value, ``key`` the choice's key). ``open`` when it accepts keys beyond its fields (extra="allow")."""

    key: str
    description: str
    children: tuple[Node, ...]
    tag: str | None = None
    selected: bool = False
    open: bool = False


@dataclass(frozen=True)
class Choice:
    """A discriminated union: ``tag`` is its type key as a leaf (type: the variants' tags), then the
    variants, in declaration order."""

    key: str
    description: str
    tag: Leaf
    variants: tuple[Section, ...]


Node = Leaf | Section | Choice


class UnknownKeyError(ValueError):
    """A key that is not in the schema; the message names it and the closest keys."""


def describe(model: type[BaseModel], values: Mapping[str, Any] | None = None) -> Section:
    """The tree of ``model``'s keys; ``values`` (``model_dump(mode="json")`` of a loaded config) fills each
    leaf's value."""
    return _section(model, "", _doc(model), values)


def select(root: Section, key: str) -> Section:
    """``root`` pruned to ``key`` (a leaf, section or choice) and everything under it, with its ancestors.

    Raises:
        UnknownKeyError: no node has ``key``; the message lists close matches.
    """
    pruned = _prune(root, key)
    if pruned is None:
        close = difflib.get_close_matches(key, list(all_keys(root)), n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(k) for k in close)}?" if close else ""
        sections = sorted({n.key for n in _nodes(root) if isinstance(n, Section | Choice) and n.key})
        raise UnknownKeyError(f"unknown key {key!r}.{hint} Sections: {', '.join(sections)}")
    return pruned


def all_keys(node: Node) -> Iterator[str]:
    """Every key under ``node``: sections, choices, their type keys and leaves (a variant's once each)."""
    seen: set[str] = set()
    for n in _nodes(node):
        for key in (n.key, n.tag.key) if isinstance(n, Choice) else (n.key,):
            if key and key not in seen:
                seen.add(key)
                yield key


def leaves(node: Node) -> Iterator[Leaf]:
    """Every leaf under ``node`` in order, a choice's type key before its variants' leaves."""
    for n in _nodes(node):
        if isinstance(n, Leaf):
            yield n
        elif isinstance(n, Choice):
            yield n.tag


def type_name(annotation: Any) -> str:
    """A type as a user writes its value: ``int | null``, ``'dis' | 'ppo_clip'``, ``list[str]``."""
    origin = get_origin(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(annotation))
    if origin is Annotated:
        return type_name(get_args(annotation)[0])
    if origin is not None and get_args(annotation):
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in get_args(annotation))}]"
    if annotation is Any:
        return "any"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def yaml_text(value: Any) -> str:
    """``value`` as it is written in a YAML file or a ``key=value`` override (flow style)."""
    plain = to_jsonable_python(value)
    if isinstance(plain, float) and math.isfinite(plain):
        return repr(plain)
    text = yaml.safe_dump(plain, default_flow_style=True, width=math.inf, sort_keys=False).strip()
    return text.removesuffix("...").strip()


def _doc(model: type[BaseModel]) -> str:
    """The first paragraph of the class's own docstring, on one line."""
    doc = model.__dict__.get("__doc__") or ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def _join(*parts: str) -> str:
    return " ".join(p.strip() for p in dict.fromkeys(parts) if p and p.strip())


def _section(
    model: type[BaseModel], key: str, description: str, values: Mapping[str, Any] | None, skip: str = ""
) -> Section:
    """``model``'s fields under ``key``; ``skip``: a variant's tag field, shown on its `Choice` instead."""
    children: list[Node] = []
    for name, info in model.model_fields.items():
        if name == skip:
            continue
        sub_key = f"{key}.{name}" if key else name
        value = values.get(name) if values is not None else None
        children.append(_node(info, sub_key, value, values is not None and name in values))
    is_open = model.model_config.get("extra") == "allow"
    if is_open and values is not None:
        for name, value in values.items():
            if name not in model.model_fields and name != skip:
                sub_key = f"{key}.{name}" if key else name
                children.append(Leaf(sub_key, "any", "-", "Extra key, passed on as given.", yaml_text(value)))
    return Section(key, description, tuple(children), open=is_open)


def _node(info: FieldInfo, key: str, value: Any, given: bool) -> Node:
    annotation = info.annotation
    description = info.description or ""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        sub_values = value if isinstance(value, Mapping) else None
        return _section(annotation, key, _join(description, _doc(annotation)), sub_values)
    union = _variants(info)
    if union is not None:
        return _choice(info, key, value if given else None, *union)
    shown = yaml_text(value) if given else None
    return Leaf(key, _with_constraints(type_name(annotation), info), _default(info), description, shown)


def _choice(info: FieldInfo, key: str, value: Any, tag: str, models: list[type[BaseModel]]) -> Choice:
    """A discriminated union field: its ``tag`` key as a leaf, then one section per variant model."""
    labels = [_tag_of(m, tag) for m in models]
    selected = str(value.get(tag)) if isinstance(value, Mapping) else None
    default = _default_model(info)
    tag_leaf = Leaf(
        f"{key}.{tag}",
        " | ".join(repr(label) for label in labels),
        _tag_of(type(default), tag) if isinstance(default, BaseModel) else REQUIRED,
        f"Selects the variant of {key}; each variant's own keys follow, set beside this one.",
        selected,
    )
    variants = []
    for model, label in zip(models, labels, strict=True):
        chosen = label == selected
        section = _section(model, key, _doc(model), value if chosen else None, skip=tag)
        variants.append(replace(section, tag=label, selected=chosen))
    return Choice(key, info.description or "", tag_leaf, tuple(variants))


def _variants(info: FieldInfo) -> tuple[str, list[type[BaseModel]]] | None:
    """(tag field, variant models) when the field is a union of pydantic models told apart by a tag."""
    annotation = info.annotation
    if get_origin(annotation) not in (Union, types.UnionType):
        return None
    members = [_strip_annotated(a) for a in get_args(annotation) if a is not type(None)]
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    if len(models) < 2 or len(models) != len(members):
        return None
    tag = info.discriminator
    if isinstance(tag, Discriminator):
        tag = tag.discriminator
    if not isinstance(tag, str):
        common = set.intersection(*(set(_literal_fields(m)) for m in models))
        tag = "type" if "type" in common else min(common, default=None)
    return (tag, models) if isinstance(tag, str) else None


def _strip_annotated(annotation: Any) -> Any:
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation


def _literal_fields(model: type[BaseModel]) -> list[str]:
    return [n for n, f in model.model_fields.items() if get_origin(f.annotation) is Literal]


def _tag_of(model: type[BaseModel], tag: str) -> str:
    """A variant's tag value (the first of its Literal); the class name when it has none."""
    field = model.model_fields.get(tag)
    if field is not None and get_origin(field.annotation) is Literal:
        return str(get_args(field.annotation)[0])
    return model.__name__


def _default_model(info: FieldInfo) -> Any:
    try:
        return info.get_default(call_default_factory=True)
    except (TypeError, ValueError):  # a factory that needs the other fields' values
        return PydanticUndefined


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return REQUIRED
    default = _default_model(info)
    return "computed" if default is PydanticUndefined else yaml_text(default)


def _with_constraints(name: str, info: FieldInfo) -> str:
    bounds = [
        f"{sign} {yaml_text(getattr(m, attr))}"
        for m in info.metadata
        for attr, sign in _CONSTRAINTS
        if getattr(m, attr, None) is not None
    ]
    return f"{name} ({', '.join(bounds)})" if bounds else name


def _nodes(node: Node) -> Iterator[Node]:
    """``node`` and every node under it, depth first in declaration order."""
    yield node
    if isinstance(node, Section):
        for child in node.children:
            yield from _nodes(child)
    elif isinstance(node, Choice):
        for variant in node.variants:
            yield from _nodes(variant)


def _prune(node: Node, key: str) -> Node | None:
    if node.key == key or node.key.startswith(key + "."):
        return node
    if node.key and not key.startswith(node.key + "."):
        return None
    if isinstance(node, Choice):
        if key == node.tag.key:
            return replace(node, variants=())
        variants = tuple(v for v in (_prune(v, key) for v in node.variants) if isinstance(v, Section))
        return replace(node, variants=variants) if variants else None
    if isinstance(node, Section):
        children = tuple(c for c in (_prune(c, key) for c in node.children) if c is not None)
        return replace(node, children=children) if children else None
    return None
