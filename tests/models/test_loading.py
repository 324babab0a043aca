"""Where a run's model comes from: a missing model directory, or one without config.json or a tokenizer, is
an error naming the directory, what is missing and (at a run's start) the key ``model.path``."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from sao.config import ConfigError, ModelConfig
from sao.models.loading import load_policy, load_tokenizer, model_from_config


def _copy_without(source: Path, target: Path, *names: str) -> Path:
    target.mkdir()
    for entry in source.iterdir():
        if entry.name not in names:
            shutil.copy(entry, target / entry.name)
    return target


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def test_a_missing_directory_is_named_as_the_model_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    message = rf"^model directory '{re.escape(str(missing))}' does not exist$"
    for load in (load_tokenizer, load_policy):
        with pytest.raises(FileNotFoundError, match=message):
            load(missing)
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(FileNotFoundError, match=r"weights\.bin' is a file, not a model directory$"):
        load_tokenizer(tmp_path / "weights.bin")


def test_a_directory_without_tokenizer_files_says_which_files_it_looked_for(
    tmp_path: Path, tiny_dense_dir: Path
) -> None:
    bare = _copy_without(tiny_dense_dir, tmp_path / "bare", *TOKENIZER_FILES)
    with pytest.raises(
        FileNotFoundError,
        match=r"bare' has no tokenizer \(none of tokenizer\.json, tokenizer_config\.json, tokenizer\.model, "
        r"vocab\.json, vocab\.txt\)$",
    ):
        load_tokenizer(bare)


def test_a_tokenizer_only_directory_still_loads(tmp_path: Path, tiny_dense_dir: Path) -> None:
    only = tmp_path / "tok"
    only.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_dense_dir / name, only / name)
    assert load_tokenizer(only).encode("hi") == load_tokenizer(tiny_dense_dir).encode("hi")


def test_model_path_errors_name_the_key_the_directory_and_the_missing_file(
    tmp_path: Path, tiny_dense_dir: Path
) -> None:
    def start(path: Path) -> Path:
        return model_from_config(ModelConfig(path=str(path)), tmp_path / "cache")

    missing = tmp_path / "nope"
    message = rf"^model\.path: model directory '{re.escape(str(missing))}' does not exist$"
    with pytest.raises(ConfigError, match=message):
        start(missing)
    no_config = _copy_without(tiny_dense_dir, tmp_path / "no_config", "config.json")
    with pytest.raises(
        ConfigError, match=r"^model\.path: '.*no_config' is not a Hugging Face checkpoint: no config\.json$"
    ):
        start(no_config)
    no_tokenizer = _copy_without(tiny_dense_dir, tmp_path / "no_tokenizer", *TOKENIZER_FILES)
    with pytest.raises(ConfigError, match=r"^model\.path: '.*no_tokenizer' has no tokenizer \(none of "):
        start(no_tokenizer)
    assert start(tiny_dense_dir) == tiny_dense_dir
