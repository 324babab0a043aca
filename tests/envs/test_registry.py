"""The env registry: register by name, build by name, load user envs from a file or a module path, and
configuration errors that say what is wrong."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import sao.envs
from sao.envs.base import (
    ENV_REGISTRY,
    ENV_TASKS,
    Env,
    EnvError,
    StepResult,
    Task,
    TrainingProgress,
    notify_training_progress,
    register_env,
)
from sao.envs.factory import load_env_class, make_env, make_env_tasks

USER_ENV = textwrap.dedent(
    """
    from sao.envs.base import StepResult

    class MyEnv:
        max_turns = 3

        def __init__(self, greeting="hello"):
            self.greeting = greeting

        async def reset(self, task):
            return [{"role": "user", "content": self.greeting + " " + task.prompt}]

        async def step(self, assistant_text):
            return StepResult(observation=[], reward=1.0, done=True)

        async def close(self):
            pass

    NOT_AN_ENV = 42

    class TaskfulEnv(MyEnv):
        @staticmethod
        def make_tasks(n, seed):
            return [Task(id=f"u-{seed}-{i}", prompt=f"p{i}") for i in range(n)]

    class ClassTasksEnv(MyEnv):
        @classmethod
        def make_tasks(cls, n, seed):
            return [Task(id=f"{cls.__name__}-{seed}-{i}", prompt="q") for i in range(n)]

    class BadTasksEnv(MyEnv):
        @staticmethod
        def make_tasks(n, seed):
            return ["not a task"] * n

    class RaisingTasksEnv(MyEnv):
        @staticmethod
        def make_tasks(n, seed):
            raise RuntimeError("no tasks today")
    """
).replace("from sao.envs.base import StepResult", "from sao.envs.base import StepResult, Task")


class _Counter:
    max_turns = 2

    def __init__(self, start: int = 0) -> None:
        self.start = start

    async def reset(self, task: Task) -> list[dict]:
        return [{"role": "user", "content": task.prompt}]

    async def step(self, assistant_text: str) -> StepResult:
        return StepResult(observation=[], done=True)

    async def close(self) -> None:
        pass


@pytest.fixture
def registered():
    """Registers ``_Counter`` as ``test-counter`` for one test, and removes it after."""
    register_env("test-counter")(_Counter)
    yield "test-counter"
    ENV_REGISTRY.pop("test-counter", None)
    ENV_TASKS.pop("test-counter", None)


def test_register_env_and_make_env_by_name_passes_kwargs(registered):
    env = make_env(registered, start=5)
    assert isinstance(env, _Counter) and env.start == 5 and isinstance(env, Env)
    assert register_env(registered)(_Counter) is _Counter  # registering the same class again is harmless


def test_registering_another_factory_under_a_taken_name_is_an_error(registered):
    with pytest.raises(EnvError, match="already registered"):
        register_env(registered)(lambda: _Counter())


def test_unknown_name_lists_the_registered_ones(registered):
    with pytest.raises(EnvError, match=r"unknown environment 'nope'; registered: .*test-counter"):
        make_env("nope")


def test_bad_kwargs_are_an_env_error_naming_the_env(registered):
    with pytest.raises(EnvError, match="cannot build environment 'test-counter'"):
        make_env(registered, no_such_arg=1)


def test_user_env_from_a_file_path(tmp_path):
    (tmp_path / "my_env.py").write_text(USER_ENV)
    env = make_env(f"{tmp_path / 'my_env.py'}:MyEnv", greeting="hi")
    assert type(env).__name__ == "MyEnv" and env.greeting == "hi" and env.max_turns == 3
    assert load_env_class(f"{tmp_path / 'my_env.py'}:MyEnv").__name__ == "MyEnv"


def test_a_user_env_file_is_imported_once_for_all_its_episodes(tmp_path):
    (tmp_path / "counted_env.py").write_text(
        USER_ENV + "\nimport builtins\nbuiltins.sao_test_imports = "
        "getattr(builtins, 'sao_test_imports', 0) + 1\n"
    )
    import builtins

    source = f"{tmp_path / 'counted_env.py'}:MyEnv"
    envs = [make_env(source) for _ in range(5)]
    try:
        assert builtins.sao_test_imports == 1  # one import, one class, five envs
        assert len({type(e) for e in envs}) == 1
    finally:
        del builtins.sao_test_imports


def test_user_env_from_a_module_path(tmp_path, monkeypatch):
    (tmp_path / "user_envs_pkg").mkdir()
    (tmp_path / "user_envs_pkg" / "__init__.py").write_text("")
    (tmp_path / "user_envs_pkg" / "games.py").write_text(USER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        env = make_env("user_envs_pkg.games:MyEnv")
        assert type(env).__name__ == "MyEnv" and env.greeting == "hello"
    finally:
        for name in ("user_envs_pkg.games", "user_envs_pkg"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("{tmp}/missing.py:MyEnv", "does not exist"),
        ("{tmp}/my_env.py:Nope", "has no attribute 'Nope'"),
        ("{tmp}/my_env.py:", "must look like"),
        (":MyEnv", "must look like"),
        ("no_such_module_xyz.sub:Env", "cannot import module 'no_such_module_xyz.sub'"),
        ("{tmp}/broken.py:MyEnv", "importing .*broken.py.* failed: SyntaxError"),
        ("{tmp}/my_env.py:NOT_AN_ENV", "cannot build environment"),
    ],
)
def test_bad_sources_are_clear_env_errors(tmp_path, source, match):
    (tmp_path / "my_env.py").write_text(USER_ENV)
    (tmp_path / "broken.py").write_text("def (:\n")
    with pytest.raises(EnvError, match=match):
        make_env(source.format(tmp=tmp_path))


def test_an_object_without_the_env_methods_is_rejected(tmp_path):
    (tmp_path / "half.py").write_text("class Half:\n    async def reset(self, task):\n        return []\n")
    with pytest.raises(EnvError, match="has no step\\(\\) method"):
        make_env(f"{tmp_path / 'half.py'}:Half")


# --- tasks an env can make ---------------------------------------------------------------------------


def _counter_tasks(n: int, seed: int) -> list[Task]:
    return [Task(id=f"c-{seed}-{i}", prompt=str(i)) for i in range(n)]


@pytest.fixture
def with_tasks():
    """Registers ``_Counter`` with a task generator as ``test-counter-tasks`` for one test."""
    register_env("test-counter-tasks", tasks=_counter_tasks)(_Counter)
    yield "test-counter-tasks"
    ENV_REGISTRY.pop("test-counter-tasks", None)
    ENV_TASKS.pop("test-counter-tasks", None)


def test_register_env_with_tasks_makes_them_through_make_env_tasks(with_tasks):
    assert make_env_tasks(with_tasks, 3, seed=5) == _counter_tasks(3, 5)
    assert make_env_tasks(with_tasks, 2) == _counter_tasks(2, 0)  # seed defaults to 0
    assert make_env_tasks(with_tasks, 0) == []
    assert register_env(with_tasks, tasks=_counter_tasks)(_Counter) is _Counter  # same again: harmless
    assert register_env(with_tasks)(_Counter) is _Counter and ENV_TASKS[with_tasks] is _counter_tasks
    with pytest.raises(EnvError, match="already has another task generator"):
        register_env(with_tasks, tasks=lambda n, seed: [])(_Counter)


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("calculator", "sao.envs.calculator"),
        ("guess_number", "sao.envs.guess_number"),
        ("long_tail", "sao.envs.long_tail"),
        ("style_shift", "sao.envs.style_shift"),
    ],
)
def test_builtins_register_their_make_tasks(name, module):
    import importlib

    make_tasks = importlib.import_module(module).make_tasks
    tasks = make_env_tasks(name, 20, seed=7)
    assert tasks == make_tasks(20, seed=7) and len(tasks) == 20 and all(isinstance(t, Task) for t in tasks)
    assert make_env_tasks(name, 20, seed=7) == tasks  # deterministic
    assert make_env_tasks(name, 20, seed=8) != tasks
    assert ENV_TASKS[name] is make_tasks


@pytest.mark.parametrize("name", ["math_tir", "code_tests"])
def test_envs_without_a_task_generator_say_to_set_a_train_file(name):
    with pytest.raises(
        EnvError, match=f"environment '{name}' does not generate its own tasks; set data.train_file"
    ):
        make_env_tasks(name, 4)


def test_a_registered_env_without_tasks_has_none_and_unknown_names_are_errors(registered):
    with pytest.raises(EnvError, match=r"does not generate its own tasks; set data\.train_file"):
        make_env_tasks(registered, 4)
    with pytest.raises(EnvError, match="unknown environment 'nope'"):
        make_env_tasks("nope", 4)


@pytest.mark.parametrize("n", [-1, 2.5, True])
def test_make_env_tasks_rejects_a_bad_count(with_tasks, n):
    with pytest.raises(EnvError, match="non-negative integer"):
        make_env_tasks(with_tasks, n)


def test_user_env_classes_may_define_make_tasks(tmp_path):
    file = tmp_path / "my_env.py"
    file.write_text(USER_ENV)
    tasks = make_env_tasks(f"{file}:TaskfulEnv", 3, seed=2)
    assert [t.id for t in tasks] == ["u-2-0", "u-2-1", "u-2-2"] and all(isinstance(t, Task) for t in tasks)
    assert [t.id for t in make_env_tasks(f"{file}:ClassTasksEnv", 2, 1)] == [
        "ClassTasksEnv-1-0",
        "ClassTasksEnv-1-1",
    ]
    with pytest.raises(EnvError, match=r"'.*my_env.py:MyEnv' does not generate its own tasks"):
        make_env_tasks(f"{file}:MyEnv", 3)
    with pytest.raises(EnvError, match=r"must return a list of sao\.envs\.Task"):
        make_env_tasks(f"{file}:BadTasksEnv", 3)
    with pytest.raises(EnvError, match="failed: RuntimeError: no tasks today"):
        make_env_tasks(f"{file}:RaisingTasksEnv", 3)
    with pytest.raises(EnvError, match="does not exist"):
        make_env_tasks(f"{tmp_path / 'missing.py'}:TaskfulEnv", 3)


def test_user_env_module_path_with_make_tasks(tmp_path, monkeypatch):
    (tmp_path / "user_tasks_pkg").mkdir()
    (tmp_path / "user_tasks_pkg" / "__init__.py").write_text("")
    (tmp_path / "user_tasks_pkg" / "games.py").write_text(USER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert len(make_env_tasks("user_tasks_pkg.games:TaskfulEnv", 5, 0)) == 5
    finally:
        for name in ("user_tasks_pkg.games", "user_tasks_pkg"):
            sys.modules.pop(name, None)


def _sao_imports(module: str, top_level_only: bool) -> set[str]:
    """The ``sao.*`` modules a source file imports (all of them, or only those its module body runs)."""
    import ast
    import importlib.util

    origin = importlib.util.find_spec(module).origin
    tree = ast.parse(Path(origin).read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = module.rsplit(".", node.level)[0] + "." if node.level else ""
            found.add(base + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("sao")}


def test_env_modules_depend_on_base_and_never_the_other_way():
    from sao.envs.builtin import BUILTIN_ENV_MODULES

    assert _sao_imports("sao.envs.base", top_level_only=True) == set()
    assert _sao_imports("sao.envs.builtin", top_level_only=False) == set()
    assert {"sao.envs.base", "sao.envs.builtin"} <= _sao_imports("sao.envs.factory", top_level_only=False)
    for module in BUILTIN_ENV_MODULES:
        assert not {"sao.envs.factory", "sao.envs.builtin"} & _sao_imports(module, top_level_only=False)


def test_a_fresh_process_builds_a_builtin_env_by_name_and_a_user_env_by_source(tmp_path):
    import subprocess

    (tmp_path / "my_env.py").write_text(USER_ENV)
    source = f"{tmp_path}/my_env.py:MyEnv"
    code = (
        "from sao.envs import make_env\n"
        f"print(type(make_env('calculator')).__name__, type(make_env({source!r})).__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["CalculatorEnv", "MyEnv"]


def test_the_registry_api_is_exported_from_sao_envs():
    for name in ("make_env_tasks", "TrainingProgress", "notify_training_progress", "register_env"):
        assert name in sao.envs.__all__ and getattr(sao.envs, name) is not None


def test_the_example_script_writes_generated_tasks(tmp_path):
    import subprocess

    out = tmp_path / "calc.jsonl"
    script = Path(__file__).parents[2] / "examples" / "make_env_tasks.py"
    done = subprocess.run(
        [sys.executable, str(script), "--env", "calculator", "--n", "5", "--seed", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(out.read_text().splitlines()) == 5
    failed = subprocess.run(
        [sys.executable, str(script), "--env", "math_tir", "--out", str(tmp_path / "x.jsonl")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode != 0 and "set data.train_file" in failed.stderr


# --- the training-progress hook ----------------------------------------------------------------------


def test_training_progress_is_frozen_plain_data():
    progress = TrainingProgress(step=3, trained_trajectories=96)
    assert (progress.step, progress.trained_trajectories) == (3, 96)
    with pytest.raises(AttributeError):
        progress.step = 4  # type: ignore[misc]
    assert TrainingProgress(3, 96) == progress
    with pytest.raises(ValueError, match="cannot be negative"):
        TrainingProgress(step=-1, trained_trajectories=0)


def test_notify_training_progress_calls_the_hook_only_when_the_env_has_it():
    seen = []

    class Tracking(_Counter):
        def set_training_progress(self, progress):
            seen.append(progress)

    progress = TrainingProgress(step=1, trained_trajectories=32)
    notify_training_progress(Tracking(), progress)
    assert seen == [progress]
    notify_training_progress(_Counter(), progress)  # no hook: nothing happens, no error
    assert seen == [progress]
