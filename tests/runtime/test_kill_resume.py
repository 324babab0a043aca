"""SIGKILL at any moment, including mid-checkpoint-write: resume finds the last committed checkpoint, whole
and loadable, the interrupted save's leftovers are removed, and the books balance (docs/faults.md,
"SIGKILL, also mid-checkpoint")."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sao.config import load_config
from sao.runtime.runner import train_sync_entry
from sao.runtime.staleness import StalenessManager
from sao.train.checkpoint import CheckpointManager

from .test_runner import _OVERRIDES

# Saves checkpoints back to back, resuming from the latest one like `sao train --resume`. At step s the
# actor's first parameter is all s, and the books see 6 starts, 4 trained, 1 dropped (1 stays pending), so
# a checkpoint's weights and counters both tell its step.
_SAVER = """
import sys, torch
from sao.models.loading import load_policy
from sao.runtime.staleness import StalenessManager
from sao.train.checkpoint import CheckpointManager

model_dir, run_dir = sys.argv[1:3]
manager = CheckpointManager(run_dir, keep_last=2)
books = StalenessManager(batch_size=4, max_staleness=10**6)
step = 0
if manager.latest() is not None:
    loaded = manager.load()
    step, model_dir = loaded.step, loaded.actor_dir
    books.load_state_dict(loaded.counters["staleness"])
actor = load_policy(model_dir, dtype="float32", device="cpu")
first = next(actor.parameters())
while True:
    step += 1
    with torch.no_grad():
        first.fill_(float(step))
    assert books.try_start(6)
    books.on_trained(4)
    books.on_dropped("too_stale", 1)
    manager.save(step, actor=actor, trainer_state={"step": step}, counters={"staleness": books.state_dict()})
    print(step, flush=True)
"""


def _read_steps(proc: subprocess.Popen, into: list[int]) -> None:
    into.extend(int(line) for line in proc.stdout)


def _hidden(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def _staging(root: Path) -> bool:
    try:
        return any(name.startswith(".step_") and ".tmp-" in name for name in (p.name for p in root.iterdir()))
    except FileNotFoundError:
        return False


def test_checkpoints_killed_at_random_moments_and_mid_save_resume_whole_and_clean_up(tiny_moe_dir, tmp_path):
    import torch

    from sao.models.loading import load_policy

    run, rng = tmp_path / "run", random.Random(0)
    root = run / "checkpoints"
    mid_save_leftovers = 0
    for kill_point in ("random", "staging dir appears", "inside the save"):
        proc = subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(tiny_moe_dir), str(run)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        saved: list[int] = []
        reader = threading.Thread(target=_read_steps, args=(proc, saved), daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while len(saved) < 2:  # this round saved at least twice
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the saver did not save twice in 60 s"
            time.sleep(0.005)
        if kill_point == "random":
            time.sleep(rng.uniform(0.0, 0.15))
        else:
            while not _staging(root):
                assert proc.poll() is None and time.monotonic() < deadline
            if kill_point == "inside the save":
                time.sleep(rng.uniform(0.0, 0.03))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader.join(timeout=10)
        proc.stderr.close()

        manager = CheckpointManager(run, keep_last=2)  # a fresh process's view
        latest = manager.latest()
        assert latest is not None
        loaded = manager.load()  # whole: every file there and readable
        # committed: the last save that returned, or the one whose pointer was written as the kill came
        assert loaded.step in (saved[-1], saved[-1] + 1), (kill_point, saved[-3:], loaded.step)
        assert loaded.trainer_state == {"step": loaded.step}
        weights = next(load_policy(loaded.actor_dir, dtype="float32", device="cpu").parameters())
        assert torch.equal(weights, torch.full_like(weights, loaded.step))  # the actor of that very step
        books = StalenessManager(batch_size=4, max_staleness=10**6)
        books.load_state_dict(loaded.counters["staleness"])
        s = books.stats()
        assert (s.started, s.trained) == (6 * loaded.step, 4 * loaded.step)
        assert s.started == s.trained + s.dropped and s.pending == 0  # pending at save -> lost_on_resume
        assert s.drops_by_reason == {"too_stale": loaded.step, "lost_on_resume": loaded.step}

        leftovers = _hidden(root)
        if kill_point == "staging dir appears":
            assert any(".tmp-" in name for name in leftovers), leftovers  # the kill did land mid-save
        mid_save_leftovers += bool(leftovers)
        assert manager.latest() == latest  # readers ignore the leftovers
        assert sorted(p.name for p in manager.clean_partial()) == leftovers
        assert _hidden(root) == [] and manager.latest() == latest
    assert mid_save_leftovers >= 1


def test_sao_train_killed_while_writing_a_checkpoint_resumes_and_the_books_balance(tmp_path):
    """A real ``sao train`` (async, checkpoint every step), SIGKILLed as a checkpoint's staging directory
    appears (after two complete checkpoints), then ``--resume`` to the end."""
    run = tmp_path / "run"
    root = run / "checkpoints"
    overrides = [*_OVERRIDES, f"logging.run_dir={run}", "trainer.total_steps=6", "logging.checkpoint_every=1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sao", "train", *overrides],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (root.is_dir() and len(list(root.glob("step_*"))) >= 2 and _staging(root)):
        assert proc.poll() is None, f"sao train ended before its third checkpoint: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "sao train did not reach its third checkpoint in 120 s"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert any(".tmp-" in name for name in _hidden(root))  # killed mid-save

    manager = CheckpointManager(run)
    killed_at = manager.load().step
    assert 2 <= killed_at < 6
    for path in manager.checkpoints():  # each checkpoint's books: its step's trajectories, none twice
        c = manager.load(path).counters
        st = c["staleness"]
        assert st["trained"] == 4 * manager.load(path).step
        assert st["started"] >= st["trained"] + sum(st["drops"].values())
        assert c["producer"]["produced"] >= st["trained"]

    # a resume with nothing left to train saves no checkpoint: it is the resume that cleans up
    early = train_sync_entry(load_config(None, [*overrides, f"trainer.total_steps={killed_at}"]), resume=True)
    assert early.steps == killed_at and _hidden(root) == []

    resumed = train_sync_entry(load_config(None, overrides), resume=True)
    assert (resumed.steps, resumed.policy_version) == (6, 6)
    c = resumed.counters
    assert c["trained"] == 24 and c["started"] == c["trained"] + c["dropped"] + c["pending"]
    assert c["produced"] >= c["trained"]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(7))  # value pretraining (0), then each step once
    assert all(r["policy/version"] == r["step"] for r in records[1:])
    assert [r["runtime/trained"] for r in records[1:]] == [4.0 * s for s in range(1, 7)]
    assert _hidden(root) == [] and CheckpointManager(run).load().step == 6
