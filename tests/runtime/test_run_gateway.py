"""`sao train` with ``data.source=gateway``/``both``: external agents' sessions, trained as episodes are.

Real runs on the tiny model: the run's gateway on a free port, an OpenAI-SDK agent (`gateway_agent`) with
many concurrent sessions, weight pushes between their turns. Checks: what was trained is, token for token,
what the engine returned to the agent; versions switch mid-session; nothing is lost or trained twice
(``started = trained + dropped + pending`` in trajectories, and in sessions); abandoned sessions are never
trained; groups are trained whole; the built-in producer can run beside the gateway."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from sao.config import ConfigError, load_config
from sao.runtime.runner import Run

from .gateway_agent import play, wait_for_gateway

BASE = [
    "model.tiny_arch=qwen3_moe", "model.device=cpu", "model.dtype=float32", "data.source=gateway",
    "gateway.port=0", "engine.max_new_tokens=8", "data.max_total_tokens=400", "logging.tensorboard=false",
    "logging.episodes=true",
]  # fmt: skip


class Trained:
    """Step observer keeping every trained trajectory."""

    def __init__(self) -> None:
        self.trajectories: list = []

    async def on_step(self, record) -> None:
        self.trajectories.extend(record.trajectories)


async def _train(overrides: list[str], run_dir: Path, resume: bool = False, **agent):
    cfg = load_config(None, [*BASE, f"logging.run_dir={run_dir}", *overrides])
    run = Run(cfg, resume=resume)
    stop = asyncio.Event()

    async def agents():
        return await play(await wait_for_gateway(run_dir), stop, **agent)

    playing = asyncio.create_task(agents())
    trained = Trained()
    await run.start()  # returns once value pretraining (on the agents' first sessions) is done
    run.observers.append(trained)
    try:
        await run.loop()
    finally:
        stop.set()
        result = await run.close()
    played = await asyncio.wait_for(playing, 60)
    return run, result, trained.trajectories, played


def test_fifty_concurrent_sessions_across_five_updates_lose_and_duplicate_nothing(tmp_path):
    overrides = [
        "trainer.batch_size=10", "trainer.total_steps=8", "runtime.max_staleness=4",
        "critic.pretrain.corpus_size=6", "critic.pretrain.max_steps=2", "gateway.session_idle_timeout_s=1",
    ]  # fmt: skip
    run, result, trained, played = asyncio.run(
        _train(
            overrides,
            tmp_path / "run",
            workers=50,
            turns=3,
            pause_s=0.4,
            abandon_every=9,
            branch_every=7,
            refuse_every=11,
        )
    )
    assert result.steps == 8 and result.policy_version == 8
    books = run.staleness.stats()
    assert books.started == books.trained + books.dropped + books.pending and books.trained == len(trained)
    sessions = run.gateway_source.session_books()
    assert sessions["admitted"] == sum(v for k, v in sessions.items() if k != "admitted")
    ends = Counter(p.end for p in played)
    assert ends["rewarded"] >= 50 and ends["abandoned"] >= 1 and ends["refused"] >= 1
    # an abandoned session is a dropped start in the books, unless it was one of value pretraining's (the
    # idle sweeper also abandons sessions the run's end cut short, and any a loaded machine kept idle)
    assert 1 <= books.drops_by_reason.get("abandoned", 0) <= sessions["abandoned"]
    assert sessions["discarded"] == ends["refused"]  # a refused first request gave its start back

    # Nothing trained twice; only rewarded sessions trained; every rewarded session trained or still queued.
    keys = [(t.metadata["session_id"], t.metadata["branch"]) for t in trained]
    assert len(keys) == len(set(keys))
    queued = {t.metadata["session_id"] for group in run.queue._queue for t in group}
    rewarded = {p.sid for p in played if p.end == "rewarded"}
    trained_ids = {sid for sid, _ in keys}
    corpus = asyncio.run(run.gateway_source.pretrain_corpus())  # done: returns at once
    assert len(corpus) == run.gateway_source.counters["pretrain/trajectories"]
    assert trained_ids <= rewarded and not trained_ids & queued
    # the rest went to value pretraining (a session there that branched gave it two trajectories)
    assert rewarded - trained_ids - queued == {t.metadata["session_id"] for t in corpus}
    assert all(t.metadata["prefix_mismatch"] == (t.metadata["branch"] == 1) for t in trained)

    # Token for token what the engine returned to the agent, and versions switching mid-session.
    by_sid = {p.sid: p for p in played}
    switched = 0
    for traj in trained:
        p = by_sid[traj.metadata["session_id"]]
        if p.branched:
            continue
        action = [i for i, m in enumerate(traj.action_mask) if m]
        generated = [traj.token_ids[i] for i in action]
        if generated != p.token_ids:
            # Under load a pause between two turns can outlast gateway.session_idle_timeout_s (1 s here): the
            # session is abandoned and the agent's next request opens a new one under the same id (as
            # docs/gateway.md says). That one's actions are the turns after it, as generated.
            assert 0 < len(generated) < len(p.token_ids) and p.token_ids[-len(generated) :] == generated
            continue
        assert [traj.rollout_logprobs[i] for i in action] == p.logprobs  # exactly: JSON round-trips floats
        assert [traj.versions[i] for i in action] == p.versions
        switched += len(set(p.versions)) > 1
    assert switched >= 1, "no session saw a weight update between its turns"
    lines = (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == len(trained) and all('"session_id"' in line for line in lines)


def test_groups_from_the_gateway_train_whole_beside_the_built_in_producer(tmp_path):
    overrides = [
        "data.source=both", "algo=grpo", "algo.group_size=2", "trainer.batch_size=4", "trainer.total_steps=3",
        "runtime.max_in_flight=4", "data.max_turns=2",
    ]  # fmt: skip
    run, result, trained, _ = asyncio.run(
        _train(overrides, tmp_path / "run", workers=3, turns=1, group_size=2)
    )
    assert result.steps == 3
    by_source = Counter(t.metadata["env"] == "gateway" for t in trained)
    assert by_source[True] >= 2 and by_source[False] >= 2  # both sources were trained
    groups = Counter(t.group_id for t in trained if t.metadata["env"] == "gateway")
    assert set(groups.values()) == {2}  # every gateway group trained whole
    books = run.staleness.stats()
    assert books.started == books.trained + books.dropped + books.pending


def test_gateway_runs_refuse_knobs_they_would_ignore_and_a_busy_port():
    for extra, key in [
        (["runtime.max_in_flight=8"], "runtime.max_in_flight"),
        (["algo=spo"], r"algo\.advantage\.prioritized_sampling"),
    ]:
        with pytest.raises(ConfigError, match=key):
            load_config(None, [*BASE, *extra])
    load_config(None, [*BASE, "algo=spo", "algo.advantage.prioritized_sampling=false"])  # what it asks for
    with pytest.raises(ConfigError, match=r"gateway\.port applies to data\.source"):
        load_config(None, ["model.tiny_arch=qwen3_moe", "gateway.port=9000"])


def test_a_resumed_gateway_run_restores_its_books_before_it_serves(tmp_path):
    base = ["critic.pretrain.corpus_size=4", "critic.pretrain.max_steps=2", "trainer.batch_size=4",
            "logging.checkpoint_every=1"]  # fmt: skip
    run_dir = tmp_path / "run"
    _, r1, _, _ = asyncio.run(_train([*base, "trainer.total_steps=2"], run_dir, workers=6, turns=1))
    assert r1.steps == 2
    (run_dir / "gateway.json").unlink()  # the resumed run writes its own (a new free port)
    second, r2, trained, _ = asyncio.run(
        _train([*base, "trainer.total_steps=4"], run_dir, resume=True, workers=6, turns=1)
    )
    assert r2.steps == 4 and len(trained) == 8  # steps 3 and 4 only
    books = second.staleness.stats()
    assert books.started == books.trained + books.dropped + books.pending and books.trained == 16
    sessions = second.gateway_source.session_books()
    assert sessions["admitted"] == sum(v for k, v in sessions.items() if k != "admitted")
    assert second.gateway_source.counters["pretrain/trajectories"] == 4  # pretrained once, not again
