"""`runtime.backend=ray` end to end on this machine: 2 FSDP2 trainer ranks (gloo) and 2 LocalEngine replicas
as Ray actors, asynchronous SAO on the test model. The books balance, tokens span policy versions, nothing
is aborted, every replica decodes with the trainer's weights after each push, a replica killed mid-run is
restarted, and a driver killed with SIGKILL resumes from its checkpoint."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from tests.runtime.test_runner import _OVERRIDES  # noqa: E402

from sao.config import load_config  # noqa: E402
from sao.runtime.ray_cluster import session_processes  # noqa: E402
from sao.runtime.runner import Run, train_sync_entry  # noqa: E402
from sao.train.checkpoint import CheckpointManager  # noqa: E402

_RAY = [
    "runtime.backend=ray", "cluster.num_cpus=4", "cluster.trainer_workers=2", "cluster.engine_replicas=2",
    "critic.pretrain.corpus_size=8", "critic.pretrain.max_steps=2",
]  # fmt: skip


def _cfg(run_dir, *extra):
    return load_config(None, [*_OVERRIDES, *_RAY, f"logging.run_dir={run_dir}", *extra])


class _Watch:
    """Records, after every weight push, whether each replica's weights equal the trainer's."""

    def __init__(self, run: Run) -> None:
        self.run, self.equal, self.versions, self.aborted, self.done = run, [], [], 0.0, 0

    async def on_step(self, record) -> None:
        group, pool = self.run.trainer, self.run.engine
        want = await asyncio.to_thread(group.checksum)
        got = [await r.engine.actor.checksum.remote() for r in pool.replicas]
        self.equal.append([g == want for g in got])
        stats = [await r.engine.actor.stats.remote() for r in pool.replicas]
        self.aborted = sum(st["aborted"] for st in stats)
        self.done = record.step
        b = record.batch
        action = b.action_mask.bool()
        for seq in range(b.num_sequences):
            self.versions.append(set(b.versions[action & (b.seq_ids == seq)].tolist()))


def test_an_async_sao_run_on_ray_trains_pushes_every_version_and_survives_a_dead_replica(tmp_path):
    # Long replies, 2 sequences decoding per replica and two steps of lead: generation, not training, is
    # the bottleneck, so the replicas are mid-reply when each step's weights arrive. No push probe: it
    # lengthens every step on the trainer side (tested on Ray in tests/runtime/test_push_verification.py).
    cfg = _cfg(tmp_path / "run", "trainer.total_steps=4", "runtime.weight_sync=broadcast",
               "engine.max_new_tokens=160", "data.max_total_tokens=400", "engine.max_concurrent=2",
               "runtime.max_staleness=2", "runtime.max_in_flight=12", "runtime.push_check.action=none",
               "logging.inspect_every=2", "logging.inspect_samples=2")  # fmt: skip

    async def main():
        run = Run(cfg)
        await run.start()
        watch = _Watch(run)
        run.observers.insert(1, watch)  # right after the weight push
        temp_dir = run.backend.parts.cluster.temp_dir
        killed = []

        async def kill_one_replica():  # while it generates, after the first push
            while watch.done < 1:
                await asyncio.sleep(0.05)
            victim = run.engine.replicas[1].engine.actor
            ray.kill(victim, no_restart=True)
            killed.append(victim)

        killer = asyncio.create_task(kill_one_replica())
        try:
            await run.loop()
        finally:
            killer.cancel()
            result = await run.close()
        return run, result, watch, temp_dir, killed

    run, result, watch, temp_dir, killed = asyncio.run(main())
    assert killed and (result.steps, result.policy_version) == (4, 4)
    c = result.counters
    assert c["trained"] == 16 and c["started"] == c["trained"] + c["dropped"] + c["pending"]
    assert all(all(step) for step in watch.equal), watch.equal  # every replica got every version
    lines = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if "reward/mean" in r]
    assert [r["policy/version"] for r in steps] == [1, 2, 3, 4]
    assert steps[-1]["runtime/engine_restarts"] >= 1  # the killed replica was restarted
    assert steps[-1]["runtime/dropped/engine_crash"] >= 1  # and its episodes in flight dropped, with why
    assert steps[-1]["trainer/world_size"] == 2
    assert any(len(v) > 1 for v in watch.versions)  # a trajectory generated across a weight update
    assert max(r["lag/version_span_max"] for r in steps) >= 1
    assert watch.aborted == 0  # weight updates never aborted a request
    assert session_processes(temp_dir) == []  # the cluster the run started is gone
    # rank 0 sent back what the sharded step computed: the kept trajectories have the trainer's numbers
    from sao.inspector import read_step_files

    kept = read_step_files(run.run_dir)
    assert [d["step"] for d in kept] == [2, 4] and all(len(d["trajectories"]) == 2 for d in kept)
    tokens = kept[-1]["trajectories"][0]["tokens"]
    assert {"advantage", "value_after", "logprob", "state"} <= set(tokens)


@pytest.mark.slow  # ~1 min: two Ray clusters (the killed driver's, the resumed run's); `make test-slow`
def test_a_ray_driver_killed_with_sigkill_resumes_from_its_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    ray_dir = Path(tempfile.mkdtemp(prefix="sao-ray-t", dir="/tmp"))  # short: Ray's socket paths live here
    overrides = [*_OVERRIDES, *_RAY, f"logging.run_dir={run_dir}", "trainer.total_steps=4",
                 "logging.checkpoint_every=1", "critic.pretrain.enabled=false",
                 "runtime.weight_sync=object_store", f"cluster.temp_dir={ray_dir}"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "sao", "train", *overrides],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    root = run_dir / "checkpoints"
    deadline = time.monotonic() + 240
    while not (root.is_dir() and list(root.glob("step_*"))):
        assert proc.poll() is None, f"sao train ended before its first checkpoint: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "no checkpoint in 240 s"
        time.sleep(0.05)
    assert session_processes(ray_dir)  # the killed driver's cluster is running
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    deadline = time.monotonic() + 60
    while session_processes(ray_dir):  # its raylet, GCS and actors follow the driver
        assert time.monotonic() < deadline, (
            f"left running after the driver's SIGKILL: {session_processes(ray_dir)}"
        )
        time.sleep(0.2)
    killed_at = CheckpointManager(run_dir).load().step
    assert 1 <= killed_at < 4
    assert (root / f"step_{killed_at:08d}" / "dcp").is_dir()  # the ranks' shards

    resumed = train_sync_entry(load_config(None, overrides), resume=True)
    assert (resumed.steps, resumed.policy_version) == (4, 4)
    c = resumed.counters
    assert c["trained"] == 16 and c["started"] == c["trained"] + c["dropped"] + c["pending"]

    # The sharded checkpoint loads into one plain process: the local runtime goes on from it.
    local = [o for o in overrides if not o.startswith(("runtime.", "cluster."))]
    more = train_sync_entry(load_config(None, [*local, "trainer.total_steps=5"]), resume=True)
    assert (more.steps, more.policy_version) == (5, 5) and more.counters["trained"] == 20
    assert session_processes(ray_dir) == []
    shutil.rmtree(ray_dir)


def test_a_gateway_run_on_ray_trains_the_agents_sessions_through_the_engine_pool(tmp_path):
    from tests.runtime.gateway_agent import play, wait_for_gateway

    overrides = [o for o in _OVERRIDES if not o.startswith("runtime.max_in_flight")]
    cfg = load_config(None, [
        *overrides, *_RAY, f"logging.run_dir={tmp_path / 'run'}", "data.source=gateway", "gateway.port=0",
        "trainer.total_steps=3", "engine.max_new_tokens=8",
    ])  # fmt: skip

    async def main():
        run = Run(cfg)
        stop = asyncio.Event()
        agents = asyncio.create_task(_agents(tmp_path / "run", stop))
        await run.start()  # the critic pretrains on the agents' first 8 sessions
        try:
            await run.loop()
        finally:
            stop.set()
            result = await run.close()
        return run, result, await asyncio.wait_for(agents, 60)

    async def _agents(run_dir, stop):
        return await play(await wait_for_gateway(run_dir), stop, workers=8, turns=2, pause_s=0.05)

    run, result, played = asyncio.run(main())
    assert (result.steps, result.policy_version) == (3, 3)
    books = run.staleness.stats()
    assert books.trained == 12 and books.started == books.trained + books.dropped + books.pending
    assert sum(p.end == "rewarded" for p in played) >= 12 + 8  # trained + the pretraining corpus
    assert run.gateway_source.counters["pretrain/trajectories"] == 8
