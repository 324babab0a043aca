"""Weight hand-off to server engines: trainer -> checkpoint names, atomic safetensors files and dirs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sao.engine.weights import WEIGHTS_FILE, to_engine_state_dict, write_safetensors, write_update_dir
from sao.models.loading import load_policy
from sao.models.moe_names import checkpoint_names


@pytest.fixture(scope="module")
def moe_state(tiny_moe_dir: Path) -> dict[str, torch.Tensor]:
    return load_policy(tiny_moe_dir, dtype="float32", device="cpu").state_dict()


def test_engine_state_dict_has_the_checkpoints_names_shapes_and_values(tiny_moe_dir: Path, moe_state) -> None:
    engine = to_engine_state_dict(moe_state)
    on_disk = load_file(tiny_moe_dir / "model.safetensors")  # what save_pretrained wrote, i.e. vLLM's names
    assert set(engine) == set(on_disk)
    assert any(".experts.3.gate_proj.weight" in name for name in engine)  # experts were unfused
    for name, tensor in on_disk.items():
        assert torch.equal(engine[name], tensor), name
    model = load_policy(tiny_moe_dir, dtype="float32", device="cpu")
    assert {n: tuple(t.shape) for n, t in engine.items()} == checkpoint_names(model)


def test_engine_state_dict_owns_its_memory_and_leaves_the_input_alone(moe_state) -> None:
    fused_name = next(n for n in moe_state if n.endswith("experts.gate_up_proj"))
    before = moe_state[fused_name].clone()
    engine = to_engine_state_dict(moe_state)
    prefix = fused_name.removesuffix("gate_up_proj")
    engine[prefix + "0.gate_proj.weight"].add_(1.0)
    assert torch.equal(moe_state[fused_name], before)
    assert all(t.is_contiguous() and t.untyped_storage().nbytes() == t.nbytes for t in engine.values())


def test_engine_state_dict_casts_and_rejects_non_tensors(moe_state) -> None:
    assert {t.dtype for t in to_engine_state_dict(moe_state, torch.bfloat16).values()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="not a tensor"):
        to_engine_state_dict({"a.weight": [1.0, 2.0]})


def test_update_dir_holds_engine_weights_and_the_config(
    tiny_moe_dir: Path, moe_state, tmp_path: Path
) -> None:
    target = write_update_dir(moe_state, tmp_path / "v1", config_from=tiny_moe_dir)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "generation_config.json", WEIGHTS_FILE]
    assert set(load_file(target / WEIGHTS_FILE)) == set(load_file(tiny_moe_dir / "model.safetensors"))
    with pytest.raises(FileExistsError):
        write_update_dir(moe_state, target)


def test_failed_update_dir_leaves_nothing_behind(tmp_path: Path) -> None:
    bad = {"a.experts.gate_up_proj": torch.zeros(2, 3, 4)}  # odd gate/up width: cannot be unfused
    with pytest.raises(ValueError, match="even"):
        write_update_dir(bad, tmp_path / "v1")
    assert list(tmp_path.iterdir()) == []


def test_safetensors_write_replaces_the_file_whole_or_not_at_all(tmp_path: Path) -> None:
    path = write_safetensors({"w": torch.ones(3)}, tmp_path / "w.safetensors")
    shared = torch.zeros(4)
    with pytest.raises(Exception):  # noqa: B017 -- safetensors refuses tensors that share memory
        write_safetensors({"a": shared, "b": shared}, path)
    assert torch.equal(load_file(path)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]
    write_safetensors({"w": torch.full((3,), 2.0)}, path)
    assert torch.equal(load_file(path)["w"], torch.full((3,), 2.0))
