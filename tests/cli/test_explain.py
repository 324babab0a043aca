"""`sao config --explain` and `sao config --reference`: the schema walked generically (sections and
discriminated unions, on a small model of its own and on `RunConfig`), the values a preset gives, unknown keys
refused with a close match, the Markdown reference holding every leaf, and the help pointing to them."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from sao.cli import app
from sao.cli.config_docs import (
    Choice,
    Leaf,
    Section,
    UnknownKeyError,
    all_keys,
    describe,
    leaves,
    select,
    type_name,
    yaml_text,
)
from sao.cli.explain import explain, reference_markdown, split_explain_args
from sao.config import RunConfig, load_config
from sao.presets import PRESETS

runner = CliRunner()


class _Band(BaseModel):
    """Band mask on the ratio."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["band"] = "band"
    eps_low: float = Field(0.3, gt=0, lt=1, description="Lower band edge.")


class _Clip(BaseModel):
    """Clipped surrogate."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["clip"] = "clip"
    eps_low: float = Field(0.2, gt=0, description="Lower clip bound.")
    lam: float | Literal["adaptive"] = Field("adaptive", description="Lambda.")


class _Mine(BaseModel):
    """A user's class."""

    model_config = ConfigDict(extra="allow")
    type: Literal["mine"] = "mine"
    path: str = Field(..., description="file.py:Class")


class _Inner(BaseModel):
    """The inner section."""

    loss: Annotated[_Band | _Clip | _Mine, Field(discriminator="type")] = Field(
        default_factory=_Band, description="The loss."
    )
    k: int = Field(2, ge=1, description="Steps.")
    tags: list[str] = Field(default_factory=list, description="Tags.")


class _Root(BaseModel):
    name: str = Field("run", description="Run name.")
    inner: _Inner = Field(default_factory=_Inner, description="Inner part.")


def _leaf(root: Section, key: str, variant: str | None = None) -> Leaf:
    """The leaf ``key`` (of the union variant tagged ``variant``, when it is inside one)."""
    node = select(root, key)
    while not isinstance(node, Leaf):
        if isinstance(node, Choice):
            if not node.variants:
                return node.tag
            node = next(v for v in node.variants if v.tag == variant)
        else:
            (node,) = node.children
    return node


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted leaf keys of a dumped config (an empty mapping is a leaf value)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_union_field_lists_each_variant_with_its_own_keys() -> None:
    root = describe(_Root)
    (inner,) = [c for c in root.children if isinstance(c, Section)]
    (choice,) = [c for c in inner.children if isinstance(c, Choice)]
    assert choice.key == "inner.loss" and choice.description == "The loss."
    assert [v.tag for v in choice.variants] == ["band", "clip", "mine"]
    assert choice.tag == Leaf("inner.loss.type", "'band' | 'clip' | 'mine'", "band", choice.tag.description)
    keys = {v.tag: [c.key for c in v.children] for v in choice.variants}
    assert keys == {"band": ["inner.loss.eps_low"], "clip": ["inner.loss.eps_low", "inner.loss.lam"],
                    "mine": ["inner.loss.path"]}  # fmt: skip
    assert _leaf(root, "inner.loss.eps_low", "band").default == "0.3"
    assert _leaf(root, "inner.loss.eps_low", "clip").default == "0.2"
    assert _leaf(root, "inner.loss.path", "mine").default == "required"
    assert choice.variants[2].open and not choice.variants[0].open


def test_values_fill_the_selected_variant_only() -> None:
    cfg = _Root(inner=_Inner(loss=_Clip(eps_low=0.25), k=3))
    root = describe(_Root, cfg.model_dump(mode="json"))
    assert _leaf(root, "inner.loss.type").value == "clip"
    assert _leaf(root, "inner.loss.eps_low", "clip").value == "0.25"
    assert _leaf(root, "inner.loss.eps_low", "band").value is None
    assert _leaf(root, "inner.k").value == "3" and _leaf(root, "inner.k").default == "2"
    (inner,) = select(root, "inner.loss").children
    assert isinstance(inner, Section) and isinstance(inner.children[0], Choice)
    assert [(v.tag, v.selected) for v in inner.children[0].variants] == [
        ("band", False),
        ("clip", True),
        ("mine", False),
    ]


def test_extra_keys_of_an_open_variant_are_shown_with_their_values() -> None:
    cfg = _Root(inner=_Inner(loss=_Mine(path="a.py:L", alpha=0.5)))  # type: ignore[call-arg]  # extra key
    root = describe(_Root, cfg.model_dump(mode="json"))
    assert _leaf(root, "inner.loss.alpha", "mine").value == "0.5"
    assert _leaf(root, "inner.loss.path", "mine").value == "a.py:L"


def test_select_of_a_key_inside_a_union_keeps_the_variants_that_have_it() -> None:
    pruned = select(describe(_Root), "inner.loss.lam")
    (inner,) = pruned.children
    assert isinstance(inner, Section)
    (choice,) = inner.children
    assert isinstance(choice, Choice)
    assert [(v.tag, [c.key for c in v.children]) for v in choice.variants] == [("clip", ["inner.loss.lam"])]
    assert list(all_keys(pruned)) == ["inner", "inner.loss", "inner.loss.type", "inner.loss.lam"]


def test_unknown_key_is_refused_naming_it_and_the_closest_key() -> None:
    with pytest.raises(UnknownKeyError, match=r"'inner\.loss\.eps_lo'.*Did you mean 'inner\.loss\.eps_low'"):
        select(describe(_Root), "inner.loss.eps_lo")
    with pytest.raises(UnknownKeyError, match=r"'inner\.los'"):
        select(describe(_Root), "inner.los")


def test_types_and_values_are_written_as_a_user_writes_them() -> None:
    assert type_name(float | Literal["adaptive"]) == "float | 'adaptive'"
    assert type_name(int | None) == "int | null"
    assert type_name(dict[str, Any]) == "dict[str, any]"
    assert type_name(list[str] | None) == "list[str] | null"
    assert _leaf(describe(_Root), "inner.loss.eps_low", "band").type == "float (> 0, < 1)"
    assert [yaml_text(v) for v in (None, True, 1e-6, 8, "auto", [], {"a": 1}, "1.0")] == [
        "null",
        "true",
        "1e-06",
        "8",
        "auto",
        "[]",
        "{a: 1}",
        "'1.0'",
    ]


def test_reference_has_a_table_per_section_and_per_union_variant() -> None:
    text = reference_markdown(describe(_Root))
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings == [
        "# Config reference",
        "## Top level",
        "## `inner`",
        "### `inner.loss`",
        "#### `inner.loss` with `type: band`",
        "#### `inner.loss` with `type: clip`",
        "#### `inner.loss` with `type: mine`",
    ]
    assert "| `inner.loss.lam` | `float \\| 'adaptive'` | `adaptive` | Lambda. |" in text
    assert text.count("| `inner.loss.eps_low` |") == 2


def test_reference_command_prints_every_leaf_of_every_preset_config() -> None:
    result = runner.invoke(app, ["config", "--reference"])
    assert result.exit_code == 0, result.output
    for preset in PRESETS:
        dumped = load_config(None, ["model.tiny_arch=qwen3", f"algo={preset}"]).to_yaml_dict()
        missing = [key for key in _flatten(dumped) if f"| `{key}` |" not in result.stdout]
        assert not missing, f"preset {preset}: {missing}"


@pytest.mark.parametrize("preset", list(PRESETS))
def test_explain_values_are_the_loaded_configs_for_every_preset(preset: str) -> None:
    args = ["model.tiny_arch=qwen3", f"algo={preset}"]
    root, origin = explain(args)
    shown = {leaf.key: leaf.value for leaf in leaves(root) if leaf.value is not None}
    dumped = _flatten(load_config(None, args).to_yaml_dict())
    assert shown == {key: yaml_text(value) for key, value in dumped.items()}
    assert f"preset {preset}" in origin


def test_explain_of_a_section_prints_each_leaf_with_the_presets_value() -> None:
    result = runner.invoke(app, ["config", "--explain", "algo", "algo=grpo"])
    assert result.exit_code == 0, result.output
    dumped = _flatten(load_config(None, ["model.tiny_arch=qwen3", "algo=grpo"]).to_yaml_dict())
    rows = _rows(result.stdout)
    shown = {key: value for key, value in rows if value != "-"}
    assert {key: yaml_text(v) for key, v in dumped.items() if key.startswith("algo.")} == shown
    # every variant's keys are listed, those of unselected variants without a value
    assert Counter(key for key, _ in rows) == Counter(leaf.key for leaf in leaves(describe(RunConfig)) if
                                                      leaf.key.startswith("algo."))  # fmt: skip


def _rows(text: str) -> list[tuple[str, str]]:
    """(key, value column) of each table row, the value cut at the offsets of its table's header."""
    rows: list[tuple[str, str]] = []
    start = end = 0
    for line in text.splitlines():
        if not line.strip():  # a block ends; its heading comes next
            start = end = 0
        elif line.startswith("key ") and " value " in line:
            start, end = line.index(" value ") + 1, line.index(" description")
        elif start and line[:1].isalpha():
            rows.append((line.split()[0], line[start:end].strip()))
    return rows


def test_explain_needs_no_model_source_and_shows_it_unset() -> None:
    root, _ = explain(["model"])
    assert _leaf(root, "model.tiny_arch").value == "null"
    assert _leaf(root, "model.path").value == "null"


def test_explain_unknown_key_exits_2_with_a_close_match() -> None:
    result = runner.invoke(app, ["config", "--explain", "trainer.batchsize"])
    assert result.exit_code == 2
    assert "'trainer.batchsize'" in result.stderr and "'trainer.batch_size'" in result.stderr


def test_explain_refuses_an_invalid_override_naming_the_key() -> None:
    result = runner.invoke(app, ["config", "--explain", "algo", "algo.k_critic=0"])
    assert result.exit_code == 2
    assert "algo.k_critic" in result.stderr


def test_explain_arguments_split_into_file_key_and_overrides(tmp_path: Any) -> None:
    path = tmp_path / "run"
    path.write_text("name: x\n")
    assert split_explain_args(["a=1", "trainer", str(path), "b=2"]) == (str(path), "trainer", ["a=1", "b=2"])
    assert split_explain_args(["x.yaml"]) == ("x.yaml", None, [])
    with pytest.raises(ValueError, match="one KEY"):
        split_explain_args(["algo", "trainer"])


def test_reference_takes_no_arguments_and_excludes_explain() -> None:
    assert runner.invoke(app, ["config", "--reference", "algo=grpo"]).exit_code == 2
    assert runner.invoke(app, ["config", "--reference", "--explain"]).exit_code == 2


def test_help_points_to_explain_presets_and_docs() -> None:
    for args in (["--help"], ["train", "--help"]):
        text = " ".join(runner.invoke(app, args).output.split())
        assert "sao config --explain" in text and "sao presets" in text and "docs/" in text, args
