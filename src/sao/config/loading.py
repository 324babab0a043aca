"""Loading a `RunConfig` from YAML plus dotted overrides, and dumping it back.

`load_config` resolves  defaults <- preset <- YAML <- overrides  and validates once. Every problem is a
`ConfigError` that names the dotted key (`algo.eps_low`), the bad value and what is allowed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sao.config.schema import DEFAULT_PRESET, ConfigError, RunConfig
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
        if key not in model.model_fields:
            raise _unknown_key([*prefix, str(key)], len(prefix), model, source)
        sub = _section_model(model, key)
        if sub is not None and isinstance(value, Mapping):
            _check_keys(value, sub, [*prefix, key], source)


def _nest(key: str) -> list[str]:
    """Split a dotted override key, checking every part against the schema."""
    parts = key.split(".")
    model: type[BaseModel] | None = RunConfig
    for i, part in enumerate(parts):
        if model is None:
            raise ConfigError(
                f"unknown key {key!r} (in overrides): {'.'.join(parts[:i])} is a value, not a section"
            )
        if part not in model.model_fields:
            raise _unknown_key(parts, i, model, "overrides")
        model = _section_model(model, part)
    return parts


def _merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge of nested dicts into a new dict; `update` wins."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _validate(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def _dotted_loc(loc: tuple[int | str, ...]) -> str:
    """The prefix of a pydantic error location that names config fields (drops union tags, list indices)."""
    parts: list[str] = []
    model: type[BaseModel] | None = RunConfig
    for item in loc:
        if model is None or item not in model.model_fields:
            break
        parts.append(str(item))
        model = _section_model(model, str(item))
    return ".".join(parts) or "config"


def _format_errors(err: ValidationError) -> str:
    """One line per dotted key: the bad value and what pydantic says is allowed."""
    problems: dict[str, tuple[Any, list[str]]] = {}
    for e in err.errors():
        key = _dotted_loc(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        problems.setdefault(key, (e.get("input"), []))[1].append(msg)
    lines = []
    for key, (value, msgs) in problems.items():
        text = " or ".join(dict.fromkeys(msgs))
        if not isinstance(value, Mapping) and value is not None:
            text = f"got {value!r}; {text[0].lower()}{text[1:]}"
        lines.append(f"  {key}: {text}")
    return "invalid config:\n" + "\n".join(lines)
