"""The env registry: register by name, build by name, load user envs from a file or a module path, and
configuration errors that say what is wrong."""

from __future__ import annotations

import sys
import textwrap

import pytest

from sao.envs.base import (
    ENV_REGISTRY,
    Env,
    EnvError,
    StepResult,
    Task,
    load_env_class,
    make_env,
    register_env,
)

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
    """
)


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
