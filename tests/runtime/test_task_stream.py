"""data.stream: a fresh task per episode from the env's own generator, resumable by its index; data.num_tasks
sizes the generated pool; optional environment libraries refused at load when missing."""

from __future__ import annotations

import pytest

from sao.config import ConfigError, load_config
from sao.envs import make_env_tasks
from sao.envs.base import Task
from sao.runtime.build import build_stream, build_tasks
from sao.runtime.factory_args import task_args
from sao.runtime.sampler import PromptSampler
from sao.runtime.task_stream import TaskStream, chunk_seed


def _calculator(n: int, seed: int) -> list[Task]:
    return make_env_tasks("calculator", n, seed)


def test_a_stream_never_repeats_a_task_across_chunks_and_is_deterministic():
    a, b = TaskStream(_calculator, seed=3, chunk=16), TaskStream(_calculator, seed=3, chunk=16)
    tasks = [a.task(i) for i in range(64)]
    assert [t.id for t in tasks] == [b.task(i).id for i in range(64)]
    assert len({t.id for t in tasks}) == 64 and tasks[17].id.startswith("17:")
    prompts = [t.prompt for t in tasks]
    assert len(set(prompts)) >= 60  # fresh problems (the calculator draws numbers; a rare repeat is chance)
    other = TaskStream(_calculator, seed=4, chunk=16)
    assert [other.task(i).prompt for i in range(16)] != prompts[:16]


def test_chunk_seeds_are_far_apart_and_namespaced():
    seeds = {chunk_seed(0, c) for c in range(1000)}
    assert len(seeds) == 1000 and min(seeds) > 256  # not the small seeds held-out task files use
    assert chunk_seed(0, 0) != chunk_seed(0, 0, namespace="pool")


def test_the_sampler_plays_the_stream_in_order_and_resumes_at_the_next_index():
    stream = TaskStream(_calculator, seed=0, chunk=8)
    sampler = PromptSampler([], seed=0, stream=stream)
    first = [sampler.next().task.id for _ in range(5)]
    assert [i.split(":")[0] for i in first] == ["0", "1", "2", "3", "4"]
    resumed = PromptSampler([], seed=0, stream=TaskStream(_calculator, seed=0, chunk=8))
    resumed.load_state_dict(sampler.state_dict())
    assert resumed.next().task.id == sampler.next().task.id  # task 5 in both
    grouped = PromptSampler([], group_size=2, seed=0, stream=TaskStream(_calculator, seed=0))
    start = grouped.next()
    assert start.size == 2 and start.group_id.startswith("0:")
    with pytest.raises(ValueError, match="not drawn by weights"):
        PromptSampler([], stream=stream, weights=lambda ids: [1.0] * len(ids))


def _cfg(*overrides: str):
    return load_config(None, ["model.tiny_arch=qwen3", *overrides])


def test_num_tasks_sizes_the_generated_pool_and_the_stream_pool_has_a_seed_of_its_own():
    assert len(build_tasks(task_args(_cfg("data.num_tasks=7").data))) == 7
    stream_args = task_args(_cfg("data.num_tasks=5", "data.stream=true").data)
    pool = build_tasks(stream_args)
    stream = build_stream(stream_args)
    assert len(pool) == 5 and stream is not None
    streamed = {stream.task(i).prompt for i in range(256)}
    assert not {t.prompt for t in pool} & streamed or len(streamed) < 256  # generated apart
    assert build_stream(task_args(_cfg().data)) is None


def test_the_task_generator_receives_the_env_kwargs_it_declares(tmp_path):
    source = tmp_path / "kw_env.py"
    source.write_text(
        "from sao.envs.base import Task\n"
        "class KwEnv:\n"
        "    max_turns = 1\n"
        "    def __init__(self, level=1, other=None): self.level = level\n"
        "    @staticmethod\n"
        "    def make_tasks(n, seed, level=1):\n"
        "        return [Task(f't{i}', f'level {level} seed {seed}') for i in range(n)]\n"
        "    async def reset(self, task): return [{'role': 'user', 'content': task.prompt}]\n"
        "    async def step(self, text): ...\n"
        "    async def close(self): ...\n"
    )
    tasks = make_env_tasks(f"{source}:KwEnv", 2, 9, level=3, other="ignored")
    assert tasks[0].prompt == "level 3 seed 9"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.stream=true", "data.train_file=t.jsonl"], "data.stream applies to tasks the env generates"),
        (["data.num_tasks=9", "data.train_file=t.jsonl"], "data.num_tasks applies"),
        (["data.stream=true", "data.source=both"], "data.stream needs data.source 'env'"),
        (["data.stream=true", "algo.preset=spo"], "prioritized sampling"),
    ],
)
def test_stream_settings_that_cannot_apply_are_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(*overrides)


def test_an_env_whose_library_is_missing_is_refused_at_load_with_the_install_command(monkeypatch):
    from sao.envs import extras

    monkeypatch.setitem(extras.OPTIONAL_ENVS, "textarena", ("no_such_module_for_sao_tests", "textarena"))
    with pytest.raises(ConfigError, match=r"data\.env: .*pip install 'sao\[textarena\]'"):
        _cfg("data.env=textarena")


def test_a_resumed_stream_run_goes_on_with_fresh_tasks(tmp_path):
    """A stream run checkpointed at step 2 and resumed to step 4 trains no prompt twice: the resumed
    sampler goes on from the stream position saved in the checkpoint."""
    import json

    from sao.runtime.runner import train_sync_entry

    run = tmp_path / "run"
    base = [
        "model.tiny_arch=qwen3_moe", "model.tiny_size=test", "model.dtype=float32", "model.device=cpu",
        "algo.preset=running_mean_8", "data.env=calculator", "data.stream=true", "data.max_turns=2",
        "data.max_total_tokens=200", "engine.max_new_tokens=8", "trainer.batch_size=4",
        "runtime.max_in_flight=4", "runtime.max_staleness=1", "logging.tensorboard=false",
        "logging.checkpoint_every=2", "logging.episodes=true", f"logging.run_dir={run}",
    ]  # fmt: skip
    assert train_sync_entry(load_config(None, [*base, "trainer.total_steps=2"])).steps == 2
    resumed = train_sync_entry(load_config(None, [*base, "trainer.total_steps=4"]), resume=True)
    assert resumed.steps == 4
    ids = [json.loads(x)["prompt_id"] for x in (run / "episodes.jsonl").read_text().splitlines()]
    assert len(ids) == 16 and len(set(ids)) == 16, ids
    assert all(":" in i for i in ids)  # stream ids "<index>:<generator id>"
