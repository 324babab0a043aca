"""The consumption rule: every leaf of `RunConfig` is read by a factory (and changing it changes what that
factory's component receives) or refused at load with an error naming the key."""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from sao.config import ConfigError, RunConfig, load_config
from sao.runtime.factories import FACTORIES, READ_AT_LOAD, REFUSED_AT_LOAD

BASE = ["model.tiny_arch=qwen3_moe"]

# Leaves whose change needs another base (the key only applies with another backend), or a value the
# generic rule below cannot derive.
SPECIAL: dict[str, tuple[list[str], Any]] = {
    "model.path": (["model.tiny_arch=qwen3_moe"], {"path": "some/checkpoint", "tiny_arch": None}),
    "model.tiny_arch": ([], "qwen3"),
    "engine.threads": (["engine.backend=process"], 3),
    "engine.python": (["engine.backend=vllm"], "/opt/venv/bin/python"),
    "engine.attach": (["engine.backend=vllm"], "http://127.0.0.1:9"),
    "engine.server_args": (["engine.backend=vllm"], ["--enforce-eager"]),
    "engine.enforce_eager": (["engine.backend=vllm"], True),
    "engine.max_model_len": (["engine.backend=vllm"], 32768),
    "engine.gpu_memory_fraction": (["engine.backend=vllm"], 0.5),
    "engine.prefix_caching": ([], False),
    "engine.prefix_cache_tokens": ([], 128),
    "model.rope_scaling": (
        [],
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096},
    ),
    "critic.freeze": ([], "none"),
    "data.env_kwargs": ([], {"turns": 2}),
    "data.eval_file": ([], "held_out.jsonl"),
    "eval.engine": ([], "shared"),  # auto resolves to frozen here
    "engine.backend": ([], "vllm"),  # process would leave eval.engine's auto at frozen
    "runtime.max_staleness": (["runtime.mode=async"], 3),
    # the typed estimator and loss (their own fields: tests/algos/test_algo_knobs.py)
    "algo.advantage": ([], {"type": "spo"}),  # critic -> critic-free, with prompt priorities
    "algo.loss": ([], {"type": "ppo_clip"}),
    "critic.pretrain.enabled": ([], False),  # null follows the preset, which pretrains
    "runtime.backend": ([], "ray"),
    "runtime.weight_sync": (["runtime.backend=ray"], "object_store"),
    "runtime.weight_bucket_mb": (["runtime.backend=ray"], 256),
    "cluster.address": (["runtime.backend=ray"], "auto"),
    "cluster.num_cpus": (["runtime.backend=ray"], 8.0),
    "cluster.num_gpus": (["runtime.backend=ray"], 0),
    "cluster.auth": (["runtime.backend=ray"], "token"),
    "cluster.temp_dir": (["runtime.backend=ray"], "/tmp/sao-ray-test"),
    **{
        f"gateway.{key}": (["data.source=gateway"], value)
        for key, value in [
            ("host", "0.0.0.0"),
            ("port", 9123),
            ("admission", "reject"),
            ("admission_timeout_s", 5.0),
            ("max_sessions", 7),
            ("session_idle_timeout_s", 60.0),
            ("max_body_bytes", 1024),
            ("max_pending", 3),
            ("retry_after_s", 4),
            ("tool_call_format", "qwen3_coder"),
            ("reasoning_parser", "none"),
        ]
    },
    "data.max_turns": ([], 7),  # caps an env's own max_turns
    "judge.url": ([], "http://127.0.0.1:9"),
    **{
        f"judge.{key}": (["judge.url=http://127.0.0.1:9"], value)
        for key, value in [
            ("model", "grader"),
            ("api_key_env", "JUDGE_KEY"),
            ("system_prompt", None),
            ("prompt", "Grade: {response}"),
            ("score_min", 1.0),
            ("score_max", 5.0),
            ("combine", "sum"),
            ("temperature", 0.5),
            ("max_tokens", 9),
            ("timeout_s", 5.0),
            ("retries", 1),
            ("concurrency", 2),
            ("cache_size", 0),
        ]
    },
    "data.stream": ([], True),
    "data.num_tasks": ([], 9),
    **{
        f"cluster.{key}": (["runtime.backend=ray", "cluster.num_cpus=64", "cluster.num_gpus=8"], value)
        for key, value in [
            ("trainer_workers", 2),
            ("trainer_cpus", 2.0),
            ("trainer_gpus", 1.0),
            ("engine_replicas", 2),
            ("engine_cpus", 2.0),
            ("engine_gpus", 1.0),
            ("placement_strategy", "SPREAD"),
            ("start_timeout_s", 30.0),
        ]
    },
}
# Keys every other value of which is refused at load (their refusal is tested below).
NO_ACCEPTED_ALTERNATIVE: set[str] = set()


def _leaves(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Dotted leaf key -> pydantic FieldInfo, recursing into sections."""
    out = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_leaves(ann, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = info
    return out


LEAVES = _leaves(RunConfig)


def _readers(key: str) -> list[str]:
    return [name for name, factory in FACTORIES.items() if key in factory.reads]


def _get(data: dict, key: str) -> Any:
    for part in key.split("."):
        data = data[part]
    return data


def _set(data: dict, key: str, value: Any) -> None:
    *sections, leaf = key.split(".")
    for part in sections:
        data = data[part]
    if isinstance(value, dict) and leaf == "path":  # model.path: swap the model source
        data.update(value)
    else:
        data[leaf] = value


def _other_value(key: str, current: Any) -> Any:
    """A different valid value for ``key``, derived from its annotation."""
    if key in SPECIAL:
        return SPECIAL[key][1]
    ann = LEAVES[key].annotation
    is_union = typing.get_origin(ann) in (typing.Union, getattr(__import__("types"), "UnionType", None))
    options = [a for a in typing.get_args(ann) if a is not type(None)] if is_union else [ann]
    for option in options:
        if typing.get_origin(option) is Literal:
            refused = REFUSED_AT_LOAD.get(key, {})
            choices = [c for c in typing.get_args(option) if c != current and c not in refused]
            if choices:
                return choices[0]
        elif option is bool:
            return not current
        elif option is int:
            return (current or 1) + 1
        elif option is float:
            return current / 2 if current else 0.5
        elif option is str:
            return f"{current or 'x'}-changed"
    raise AssertionError(f"no rule to change {key} (annotation {ann}); add it to SPECIAL")


def _unread(leaves) -> list[str]:
    return [key for key in leaves if not _readers(key) and key not in READ_AT_LOAD]


def test_every_leaf_is_read_by_a_factory_or_at_load():
    unread = _unread(LEAVES)
    assert not unread, f"config keys read by no factory (add them to FACTORIES or refuse them): {unread}"


def test_the_table_names_only_real_keys():
    for name, factory in FACTORIES.items():
        for key in factory.reads:  # exact leaves: no wildcard, no section handed over as a whole
            assert key in LEAVES, (name, key)
        for section in factory.sections:  # a component is handed sections, never the whole config
            assert section and (section in LEAVES or any(k.startswith(section + ".") for k in LEAVES))


def _changed(key: str) -> tuple[RunConfig, RunConfig]:
    """The base config for ``key`` and the same config with ``key`` changed."""
    extra, _ = SPECIAL.get(key, ([], None))
    base_cfg = load_config(None, [*BASE, *extra])
    data = copy.deepcopy(base_cfg.to_yaml_dict())
    _set(data, key, _other_value(key, _get(data, key)))
    return base_cfg, RunConfig.model_validate(data)


CHANGEABLE = sorted(k for k in LEAVES if k not in {*READ_AT_LOAD, *NO_ACCEPTED_ALTERNATIVE})


@pytest.mark.parametrize("key", CHANGEABLE)
def test_changing_a_key_changes_what_each_reader_receives(key):
    base_cfg, changed = _changed(key)
    for name in _readers(key):
        assert FACTORIES[name](base_cfg) != FACTORIES[name](changed), f"{name} ignores {key}"


# Factories whose arguments legitimately follow a key they do not read: the key changes which other values
# are valid or resolved (base config differs), e.g. `runtime.backend=ray` moves `runtime.weight_sync`'s auto.
DERIVED: dict[str, set[str]] = {}


@pytest.mark.parametrize("key", CHANGEABLE)
def test_a_factory_receives_only_the_keys_it_declares(key):
    """The other half of "every key, exactly": a factory that does not list ``key`` gets equal arguments
    when ``key`` changes (an undeclared read would make the table lie)."""
    base_cfg, changed = _changed(key)
    for name, factory in FACTORIES.items():
        if name in _readers(key) or name in DERIVED.get(key, set()):
            continue
        assert factory(base_cfg) == factory(changed), f"{name} reads {key} without declaring it"


def _sections_in(value: Any, path: str) -> list[str]:
    """Paths inside a factory's arguments that hold a whole config section."""
    from sao.config.section import Section

    if isinstance(value, Section):
        return [path]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            p
            for f in dataclasses.fields(value)
            for p in _sections_in(getattr(value, f.name), f"{path}.{f.name}")
        ]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _sections_in(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _sections_in(v, f"{path}[{k!r}]")]
    return []


def test_no_factory_hands_over_a_whole_section():
    """Arguments are plain values (and the typed estimator and loss, which are components): a section in
    them would let a key pass the consumption test without anything reading it."""
    cfg = load_config(None, BASE)
    found = [p for name, factory in FACTORIES.items() for p in _sections_in(factory(cfg), name)]
    assert not found, f"whole config sections handed to components: {found}"


def test_the_preset_key_selects_the_preset_at_load():
    assert load_config(None, [*BASE, "algo=grpo"]).algo.advantage.type == "grpo"
    assert load_config(None, [*BASE, "algo.preset=spo"]).algo.advantage.type == "spo"


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, vs in REFUSED_AT_LOAD.items() for v in vs])
def test_refused_values_are_config_errors_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [*BASE, f"{key}={value}"])


def test_a_key_added_to_the_schema_and_read_nowhere_fails_the_rule():
    """The rule itself: a schema with one more leaf, read by no factory, reports exactly that leaf."""
    from pydantic import Field, create_model

    from sao.config import schema

    runtime = create_model("RuntimeWithKnob", __base__=schema.RuntimeConfig, new_knob=(int, Field(0)))
    extended = create_model(
        "RunWithKnob", __base__=RunConfig, runtime=(runtime, Field(default_factory=runtime))
    )
    assert _unread(_leaves(extended)) == ["runtime.new_knob"]


def test_a_malformed_task_file_is_a_config_error_naming_the_key_file_and_line(tmp_path):
    from sao.runtime.build import build_tasks
    from sao.runtime.factory_args import task_args

    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2" "answer": "4"}\n')
    cfg = load_config(None, [*BASE, f"data.train_file={bad}"])
    with pytest.raises(ConfigError, match=r"data\.train_file: .*tasks\.jsonl:2: invalid JSON"):
        build_tasks(task_args(cfg.data))
    bad.write_text("\n\n")
    with pytest.raises(ConfigError, match=r"data\.train_file: .*tasks\.jsonl has no tasks"):
        build_tasks(task_args(cfg.data))


def test_the_loops_turn_bound_caps_an_envs_own_so_it_grades_on_the_last_turn():
    from sao.runtime.args import EnvArgs
    from sao.runtime.build import build_env_factory

    assert build_env_factory(EnvArgs("guess_number", {"max_turns": 12}, max_turns=5))().max_turns == 5
    assert build_env_factory(EnvArgs("guess_number", {"max_turns": 3}, max_turns=5))().max_turns == 3
    assert build_env_factory(EnvArgs("guess_number", {"max_turns": 12}))().max_turns == 12
