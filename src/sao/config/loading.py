"""Loading a `RunConfig` from YAML plus dotted overrides, and dumping it back.

`load_config` resolves  defaults <- preset <- YAML <- overrides  and validates once. Every problem is a
`ConfigError` that names the dotted key (`algo.loss.eps_low`), the bad value and what is allowed.

A section chosen by ``type`` (``algo.advantage``, ``algo.loss``: a union of classes) merges key by key while
the type stays; a layer that names another type starts that class afresh from its own defaults (the lower
layers' keys belong to the other class). Keys inside such a section are checked when the whole config is
validated, against the class its ``type`` selects.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sao.algos.custom import CustomFieldsError
from sao.config.algo import MOVED_KEYS, AlgoConfig
from sao.config.schema import DEFAULT_PRESET, ConfigError, RunConfig
from sao.config.unions import union_paths, union_variants
from sao.presets import PRESETS


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads `1e-5` as a float (YAML 1.2) rather than the string YAML 1.1 makes of it."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def dump_config(cfg: RunConfig) -> str:
    """The fully resolved config as YAML; `load_config` of it gives back an equal config."""
    return yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Load, merge and validate a run config.

    Precedence, lowest first: field defaults <- preset <- YAML file <- dotted overrides (`key.sub=value`,
    the value parsed as YAML, so `1e-5`, `true`, `[a,b]` and `null` work). The preset is chosen
    by an override `algo=NAME` or `algo.preset=NAME`, else the YAML's `algo.preset` (or `algo: NAME`), else
    `sao`; it only fills fields the YAML and overrides leave unset.

    Raises:
        ConfigError: unreadable file, unknown key, unknown preset or invalid value; the message names the key.
    """
    file_data = _read_yaml(Path(path)) if path is not None else {}
    if isinstance(file_data.get("algo"), str):
        file_data["algo"] = {"preset": file_data["algo"]}
    _check_keys(file_data, RunConfig, [], source=str(path))

    override_data: dict[str, Any] = {}
    for item in overrides:
        key, value = _parse_override(item)
        if key.startswith("algo.") and key.count(".") == 1:
            _refuse_moved(key.split(".")[1], value, "overrides")
        if key == "algo" and isinstance(value, str):
            key = "algo.preset"
        for part in reversed(_nest(key)):
            value = {part: value}
        override_data = _merge(override_data, value)
    _check_keys(override_data, RunConfig, [], source="overrides")

    preset = _pick_preset(file_data, override_data)
    preset_data = _merge(PRESETS[preset], {"algo": {"preset": preset}})
    return _validate(_merge(_merge(preset_data, file_data), override_data))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(), Loader=_Loader)
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(data).__name__}")
    return data


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    try:
        return key, yaml.load(raw, Loader=_Loader)
    except yaml.YAMLError:
        raise ConfigError(f"override {key}: cannot parse value {raw!r} as YAML") from None


def _pick_preset(file_data: Mapping[str, Any], override_data: Mapping[str, Any]) -> str:
    def named(data: Mapping[str, Any]) -> Any:
        algo = data.get("algo")
        return algo.get("preset") if isinstance(algo, Mapping) else None

    name = named(override_data) or named(file_data) or DEFAULT_PRESET
    if name not in PRESETS:
        raise ConfigError(f"algo.preset: unknown preset {name!r}; available: {', '.join(PRESETS)}")
    return name


def _section_model(model: type[BaseModel], field: str) -> type[BaseModel] | None:
    annotation = model.model_fields[field].annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _unknown_key(parts: list[str], index: int, model: type[BaseModel], source: str) -> ConfigError:
    """Error for `parts[index]`, which is not a field of `model` (the section `parts[:index]`)."""
    allowed = list(model.model_fields)
    section = f"in {'.'.join(parts[:index])}" if index else "at the top level"
    close = difflib.get_close_matches(parts[index], allowed, n=1)
    hint = f" Did you mean {'.'.join([*parts[:index], close[0]])!r}?" if close else ""
    return ConfigError(
        f"unknown key {'.'.join(parts)!r} (in {source}).{hint} Allowed keys {section}: {', '.join(allowed)}"
    )


def _check_keys(data: Mapping[str, Any], model: type[BaseModel], prefix: list[str], source: str) -> None:
    """Raise on the first key of `data` that is not a field of `model`, recursing into sections."""
    for key, value in data.items():
        if model is AlgoConfig:
            _refuse_moved(str(key), value, source)
        if key not in model.model_fields:
            raise _unknown_key([*prefix, str(key)], len(prefix), model, source)
        sub = _section_model(model, key)
        if sub is not None and isinstance(value, Mapping):
            _check_keys(value, sub, [*prefix, key], source)


def _refuse_moved(key: str, value: Any, source: str) -> None:
    """A flat ``algo`` key of earlier versions, or a section chosen by type given as a name: refused with the
    new spelling."""
    if key in ("advantage", "loss") and isinstance(value, str):
        raise ConfigError(
            f"algo.{key} (in {source}) is a section chosen by its type now: write algo.{key}.type={value} "
            f"(YAML: `{key}: {{type: {value}}}`); `sao config --explain algo.{key}` lists the types"
        )
    moved = MOVED_KEYS.get(key)
    if moved is None:
        return
    section, field = moved.split(".")
    spelling = f"algo.{moved}" + ("" if isinstance(value, Mapping) or value is None else f"={value}")
    variants = union_variants(AlgoConfig, section) or {}
    owners = [tag for tag, cls in variants.items() if field in cls.model_fields and tag != "custom"]
    if field != "type" and len(owners) < len(variants) - 1:
        spelling += f" (a field of algo.{section}.type {' / '.join(owners)})"
    hint = " (`sao config --migrate FILE` rewrites a whole file)" if source != "overrides" else ""
    raise ConfigError(f"algo.{key} (in {source}) has moved: write {spelling}{hint}")


def _nest(key: str) -> list[str]:
    """Split a dotted override key, checking every part against the schema (inside a section chosen by
    ``type`` the keys are checked at validation, against the chosen class)."""
    parts = key.split(".")
    model: type[BaseModel] | None = RunConfig
    for i, part in enumerate(parts):
        if model is not None and union_variants(model, part) is not None:
            return parts
        if model is None:
            raise ConfigError(
                f"unknown key {key!r} (in overrides): {'.'.join(parts[:i])} is a value, not a section"
            )
        if part not in model.model_fields:
            raise _unknown_key(parts, i, model, "overrides")
        model = _section_model(model, part)
    return parts


def _merge(base: Mapping[str, Any], update: Mapping[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Deep merge of nested dicts into a new dict; `update` wins. A section chosen by ``type`` whose type
    `update` changes is replaced, not merged (module docstring)."""
    merged = dict(base)
    for key, value in update.items():
        here = (*path, str(key))
        lower = merged.get(key)
        if isinstance(value, Mapping) and isinstance(lower, Mapping):
            retyped = (
                here in _UNIONS and "type" in value and value["type"] != lower.get("type", value["type"])
            )
            merged[key] = dict(value) if retyped else _merge(lower, value, here)
        else:
            merged[key] = value
    return merged


_UNIONS = union_paths(RunConfig)


def _validate(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def _dotted_loc(loc: tuple[int | str, ...]) -> tuple[str, type[BaseModel] | None]:
    """The prefix of a pydantic error location that names config fields (drops union tags and list
    indices), and the model of the section it ends in (None past a value)."""
    parts: list[str] = []
    model: type[BaseModel] | None = RunConfig
    items = list(loc)
    while items and model is not None:
        item = str(items.pop(0))
        if item not in model.model_fields:
            if model.model_config.get("extra") == "forbid":
                parts.append(item)  # the unknown key itself
            break
        parts.append(item)
        variants = union_variants(model, item)
        if variants is not None:
            model = variants.get(str(items.pop(0))) if items and str(items[0]) in variants else None
        else:
            model = _section_model(model, item)
    return ".".join(parts) or "config", model


def _format_errors(err: ValidationError) -> str:
    """One line per dotted key: the bad value and what pydantic says is allowed."""
    problems: dict[str, tuple[Any, list[str]]] = {}
    for e in err.errors():
        key, model = _dotted_loc(e["loc"])
        cause = e.get("ctx", {}).get("error")
        if isinstance(cause, CustomFieldsError):  # a user class's own fields: one line per field
            for field, text in cause.problems:
                problems.setdefault(f"{key}.{field}", (None, []))[1].append(f"{text} ({cause.origin})")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "union_tag_invalid":
            key, msg = f"{key}.type", f"unknown type; choose one of {e['ctx']['expected_tags']}"
        elif e["type"] == "extra_forbidden" and model is not None:
            close = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(model.model_fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            kind = model.model_fields["type"].default if "type" in model.model_fields else None
            where = f" of type {kind}" if kind else ""
            msg = f"unknown key{where}{hint}; allowed: {', '.join(model.model_fields)}"
        value = e["ctx"]["tag"] if e["type"] == "union_tag_invalid" else e.get("input")
        problems.setdefault(key, (value, []))[1].append(msg)
    lines = []
    for key, (value, msgs) in problems.items():
        text = " or ".join(dict.fromkeys(msgs))
        if not isinstance(value, Mapping) and value is not None:
            text = f"got {value!r}; {text[0].lower()}{text[1:]}"
        lines.append(f"  {key}: {text}")
    return "invalid config:\n" + "\n".join(lines)
