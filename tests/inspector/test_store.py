"""The kept step files: atomic writes, the disk bound (thinning keeps the spread), reading them back."""

from __future__ import annotations

import gzip
import json

import pytest

from sao.inspector.store import FORMAT, InspectStore, read_step_files, step_files


def _records(n_tokens: int) -> list[dict]:
    return [{"kind": "train", "traj_id": "t", "tokens": {"id": list(range(n_tokens))}}]


def test_a_step_file_round_trips_with_its_meta(tmp_path):
    store = InspectStore(tmp_path, max_bytes=10**6, meta={"preset": "sao"})
    path = store.write(5, _records(3))
    assert path.name == "step_00000005.json.gz"
    (doc,) = read_step_files(tmp_path)
    assert doc == {"format": FORMAT, "step": 5, "meta": {"preset": "sao"}, "trajectories": _records(3)}
    assert not list(store.directory.glob("*.tmp"))  # written atomically


def test_the_bound_thins_to_steps_spread_over_the_run_with_the_first_and_the_newest(tmp_path):
    one = len(gzip.compress(json.dumps({"x": list(range(3000))}).encode()))  # order of one file's size
    store = InspectStore(tmp_path, max_bytes=6 * one, meta={})
    for step in range(1, 41):
        store.write(step, _records(3000))
        assert store.total_bytes() <= 6 * one * 1.5  # never far past the bound (one file of slack)
    kept = [s for s, _ in step_files(store.directory)]
    assert kept[0] == 1 and kept[-1] == 40 and store.thinned == 40 - len(kept)
    assert 4 <= len(kept) <= 7
    assert any(10 <= s <= 20 for s in kept) and any(20 < s <= 32 for s in kept)  # not only the newest


def test_reading_names_the_step_and_the_key_when_nothing_is_kept(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"logging\.inspect_every"):
        read_step_files(tmp_path)
    InspectStore(tmp_path, 10**6, {}).write(2, _records(1))
    with pytest.raises(FileNotFoundError, match=r"step 3 \(kept steps: 2\)"):
        read_step_files(tmp_path, step=3)
    (tmp_path / "inspect" / "step_00000004.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"step_00000004\.json\.gz: not a readable inspection file"):
        read_step_files(tmp_path)


def test_a_bound_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="max_bytes"):
        InspectStore(tmp_path, 0, {})


def test_a_resumed_run_deletes_the_kept_steps_it_trains_again(tmp_path):
    from sao.runtime.args import InspectArgs
    from sao.runtime.inspection import TrajectoryInspector

    store = InspectStore(tmp_path, 10**6, {})
    for step in (2, 4, 6):
        store.write(step, _records(1))
    args = InspectArgs(tmp_path, every=2, samples=4, max_bytes=10**6, seed=0, meta={})
    inspector = TrajectoryInspector(args, trainer=None, tokenizer=None, resume_step=4)
    assert [s for s, _ in step_files(store.directory)] == [2, 4]
    assert inspector.wants(6) and not inspector.wants(5)
    TrajectoryInspector(args, trainer=None, tokenizer=None, resume_step=-1)  # resumed without a checkpoint
    assert step_files(store.directory) == []


def test_the_kept_trajectories_are_a_seeded_choice_per_step():
    from sao.runtime.inspection import pick_samples

    assert pick_samples(16, 4, seed=0, step=3) == pick_samples(16, 4, seed=0, step=3)
    assert pick_samples(16, 4, seed=0, step=3) != pick_samples(16, 4, seed=0, step=4)
    assert pick_samples(3, 8, seed=0, step=1) == [0, 1, 2]  # a small batch: every trajectory
    chosen = pick_samples(16, 4, seed=1, step=2)
    assert len(set(chosen)) == 4 and chosen == sorted(chosen)
