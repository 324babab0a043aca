"""``textarena``: the games of the TextArena library (``pip install 'sao[textarena]'``) as sao envs.

Config (``data.env: textarena``, ``data.env_kwargs``):

- ``game``: a TextArena env id (``GuessTheNumber-v0``, ``TicTacToe-v0``, ...). Only games of 1 or 2 players
  are played; a game that cannot start here (it downloads NLTK corpora, calls OpenRouter, or fails to
  import under this Python) is refused at construction with the game's error.
- ``game_kwargs``: keyword arguments for ``textarena.make(game, **game_kwargs)`` (they override the id's own).
- ``opponent``: two-player games only, required there (see `sao.envs.textarena_opponents`): ``"random"``,
  ``"file.py:Class"`` / ``"module:Class"``, or ``{type: openai, base_url, model, ...}``.
- ``player_id``: the model's seat in a two-player game, 0 (default), 1 or ``"random"`` (drawn from each
  task's seed, so the same task always seats the model the same way).
- ``max_turns``: the most model turns per episode (default 100; the agent loop also caps it).
- ``system_prompt``: an optional system message before the game's first observation.

Tasks (`make_tasks`): each task is a game seed, ``metadata = {"game": ..., "seed": ...}``; ``reset`` starts
the game with ``reset(num_players, seed)``. TextArena games draw from Python's process-wide ``random``,
seeded by the game at reset; each episode here keeps its own copy of that generator state, swapped in around
every call into the game, so an episode plays the same for the same seed whatever runs beside it. Calls into
a game run in a worker thread (``asyncio.to_thread``), one at a time in the process (the generator is
shared), so a slow one (a Sokoban-v0-medium reset can take seconds) does not stall the event loop.

Turns: the model's first message is its seat's observation (the game's prompt and board). Each ``step``
plays the assistant text as the model's action (the whole text, through the id's action wrappers, as
TextArena does), then lets the opponent move as long as the game gives it the turn; the observation is one
user message with what is new for the model, in TextArena's ``[GAME] ...`` / ``[Player 1] ...`` line
format, without the model's own move echoed back. An invalid move is the game's business (it usually says
so and asks again, or ends the game as a loss). An exception inside the game (`GameError`) or an opponent
(`OpponentError`) propagates: the agent loop drops the episode as ``env_error``.

Rewards: TextArena gives rewards only when a game ends (0.7.4 has no per-turn rewards), so every turn
before the end is 0 and the last is the game's reward for the model's seat, unchanged: two-player games
+1 win / -1 loss / 0 draw; single-player games their own scale (e.g. GuessTheNumber: 1 when found, else
how close the last guess was, in [0, 1]). ``info`` carries ``game``, ``seat``, ``turn`` and at the end
``game_rewards`` (every seat's raw reward), ``reason`` and ``invalid_move`` (the game's ``game_info``).
When ``max_turns`` model turns pass before the game ends, that turn's ``info["truncated"]`` is True; the
agent loop stops there (finish ``max_turns``) and the outcome is that turn's reward, 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import io
import json
import random
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sao.envs.base import EnvError, Message, StepResult, Task, register_env
from sao.envs.extras import install_command, require_library
from sao.envs.textarena_opponents import Opponent, OpponentTurn, opponent_factory

__all__ = ["DEFAULT_MAX_TURNS", "GameError", "GameSpec", "TextArenaEnv", "game_spec", "make_tasks"]

DEFAULT_MAX_TURNS = 100
MAX_OPPONENT_MOVES = 1000  # opponent moves in a row before the game is deemed stuck
INSTALL = install_command("textarena")
NOTHING_NEW = "[GAME] Your turn."  # when the game has no new message for the model (rare)


# Python's `random` is process-wide and every TextArena game uses it: one game call at a time, in any thread
# (the episode's generator state is swapped in and out under this lock), queued per event loop so that
# waiting calls hold no worker thread.
_GLOBAL_RANDOM = threading.Lock()
_LOOP_QUEUES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


class GameError(RuntimeError):
    """A TextArena game that raised, or ended without rewards (the game's failure, not the model's)."""


def _textarena() -> Any:
    return require_library("textarena")


def _unwrap(env: Any, ta: Any) -> Any:
    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


@dataclass(frozen=True)
class GameSpec:
    """A game checked by starting it once: its number of players and TextArena env class name."""

    game: str
    num_players: int
    env_class: str


_SPECS: dict[str, GameSpec] = {}  # (game, game_kwargs) -> its spec; one probe per process


def _check_game_id(ta: Any, game: Any) -> None:
    if not isinstance(game, str) or not game:
        raise EnvError(f"textarena: data.env_kwargs.game must be a TextArena env id, got {game!r}")
    from textarena.envs.registration import ENV_REGISTRY

    if game not in ENV_REGISTRY:
        close = difflib.get_close_matches(game, list(ENV_REGISTRY), n=6, cutoff=0.5)
        hint = f"; close ids: {', '.join(close)}" if close else ""
        raise EnvError(f"textarena: unknown game {game!r}{hint}")


def game_spec(game: str, game_kwargs: dict[str, Any] | None = None) -> GameSpec:
    """Check ``game`` by building it and resetting it once with 1, then 2 players (cached per process).

    Raises `EnvError` for an unknown id (naming close ones), a game that cannot start here (its error),
    and a game that needs more than 2 players.
    """
    ta = _textarena()
    _check_game_id(ta, game)
    kwargs = dict(game_kwargs or {})
    key = json.dumps([game, kwargs], sort_keys=True, default=repr)
    if key not in _SPECS:
        with _GLOBAL_RANDOM:
            outer = random.getstate()
            try:
                _SPECS[key] = _probe(ta, game, kwargs)
            finally:
                random.setstate(outer)
    return _SPECS[key]


def _probe(ta: Any, game: str, kwargs: dict[str, Any]) -> GameSpec:
    errors = []
    for players in (1, 2):
        sink = io.StringIO()  # nltk and some games print while failing
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                env = ta.make(game, **kwargs)
                env.reset(num_players=players, seed=0)
            state = _unwrap(env, ta).state
        except Exception as err:
            errors.append(f"with {players} player(s): {type(err).__name__}: {str(err).strip()[:300]}")
            continue
        if (players == 1 and isinstance(state, ta.SinglePlayerState)) or (
            players == 2 and state.num_players == 2
        ):
            return GameSpec(game, players, type(_unwrap(env, ta)).__name__)
        errors.append(f"with {players} player(s): the game set up {state.num_players} players")
    hint = ""
    if any("LookupError" in e for e in errors):
        hint = " (it needs NLTK data: run `python -m nltk.downloader words` where there is network access)"
    raise EnvError(f"textarena: game {game!r} cannot be played here{hint}: {'; '.join(errors)}")


def make_tasks(n: int, seed: int = 0, game: str | None = None) -> list[Task]:
    """``n`` tasks of ``game``, one game seed each (deterministic in ``seed`` and ``game``; a longer list
    extends a shorter one). Checks the game id only (no game is started)."""
    if game is None:
        raise EnvError("textarena: data.env_kwargs.game is required (a TextArena env id)")
    _check_game_id(_textarena(), game)
    rng = random.Random(f"textarena-{game}-{seed}")
    tasks = []
    for i in range(n):
        game_seed = rng.randrange(2**31)
        tasks.append(
            Task(
                id=f"textarena-{game}-{seed}-{i}",
                prompt=f"Play the TextArena game {game} (seed {game_seed}).",
                metadata={"game": game, "seed": game_seed},
            )
        )
    return tasks


@register_env("textarena", tasks=make_tasks)
class TextArenaEnv:
    """A TextArena game, one episode per task seed; see the module docstring."""

    make_tasks = staticmethod(make_tasks)

    def __init__(
        self,
        game: str,
        game_kwargs: dict[str, Any] | None = None,
        opponent: Any = None,
        player_id: int | str = 0,
        max_turns: int | None = None,
        system_prompt: str | None = None,
    ) -> None:
        if game_kwargs is not None and not isinstance(game_kwargs, dict):
            raise EnvError(f"textarena: game_kwargs must be a mapping, got {game_kwargs!r}")
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)):
            raise EnvError(f"textarena: max_turns must be an integer, got {max_turns!r}")
        if max_turns is not None and max_turns < 1:
            raise EnvError(f"textarena: max_turns must be >= 1, got {max_turns}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise EnvError(f"textarena: system_prompt must be a string, got {system_prompt!r}")
        self.spec = game_spec(game, game_kwargs)
        self.game, self.game_kwargs = game, dict(game_kwargs or {})
        self.max_turns = max_turns or DEFAULT_MAX_TURNS
        self.system_prompt = system_prompt
        self._player_id = player_id
        if self.spec.num_players == 1:
            if opponent is not None:
                raise EnvError(f"textarena: {game} is a single-player game; remove the opponent")
            if player_id != 0:
                raise EnvError(f"textarena: {game} is a single-player game; player_id must be 0")
            self._opponents = None
        else:
            if opponent is None:
                raise EnvError(
                    f"textarena: {game} is a two-player game; set data.env_kwargs.opponent "
                    "('random', 'file.py:Class' or {type: openai, ...})"
                )
            if player_id not in (0, 1, "random"):
                raise EnvError(f"textarena: player_id must be 0, 1 or 'random', got {player_id!r}")
            self._opponents = opponent_factory(opponent, self.spec.env_class)
        self._ta: Any = None
        self._wrapped: Any = None  # the game as textarena.make returns it (its action wrappers apply)
        self._game: Any = None  # the unwrapped game: state and raw observations
        self._opponent: Opponent | None = None
        self._random_state: Any = None
        self._history: dict[int, list[str]] = {}
        self._seat = 0
        self._turns = 0
        self._done = True

    @property
    def textarena_env(self) -> Any:
        """The unwrapped TextArena env of the episode in progress (None before `reset`), to read its state
        (e.g. a scripted policy); do not modify it."""
        return self._game

    # ---- the game, under the episode's own random state ----

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        with _GLOBAL_RANDOM:
            outer = random.getstate()
            if self._random_state is not None:
                random.setstate(self._random_state)
            try:
                yield
            finally:
                self._random_state = random.getstate()
                random.setstate(outer)

    def _call_now(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with self._own_random():
            try:
                return fn(*args, **kwargs)
            except Exception as err:
                raise GameError(f"game {self.game}: {what} raised {type(err).__name__}: {err}") from err

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` of the game, in a worker thread under the episode's random state."""
        queue = _LOOP_QUEUES.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        async with queue:
            return await asyncio.to_thread(self._call_now, what, fn, *args, **kwargs)

    async def _play(self, action: str) -> bool:
        """One move by the player to move; whether the game is over."""
        result = await self._call("step", self._wrapped.step, action)
        return bool(result[0] if isinstance(result, tuple) else result)

    async def _take_observation(self) -> tuple[int, str]:
        """The player to move and what is new for it (its own moves left out); its full history grows."""
        player, messages = await self._call("get_observation", self._game.get_observation)
        roles = self._game.state.role_mapping
        new_lines = []
        for sender, text, kind in messages:
            name = "GAME" if sender == self._ta.GAME_ID else roles.get(sender, f"Player {sender}")
            line = f"[{name}] {text}"
            self._history.setdefault(player, []).append(line)
            if not (sender == player and getattr(kind, "name", "") == "PLAYER_ACTION"):
                new_lines.append(line)
        return player, "\n".join(new_lines) or NOTHING_NEW

    async def _opponent_moves(self, done: bool) -> bool:
        """Let the opponent move while the game gives it the turn; whether the game is over."""
        moves = 0
        while not done and self._game.state.current_player_id != self._seat:
            if self._opponent is None:
                raise GameError(
                    f"game {self.game} gave the turn to seat {self._game.state.current_player_id}"
                )
            player, new_text = await self._take_observation()
            full = "\n" + "\n".join(self._history.get(player, []))
            action = await self._opponent.act(OpponentTurn(player, full, new_text, self._game))
            done = await self._play(action)
            moves += 1
            if moves >= MAX_OPPONENT_MOVES and not done:
                raise GameError(
                    f"game {self.game}: the opponent moved {moves} times without giving the turn back"
                )
        return done

    def _seat_for(self, seed: int) -> int:
        if self._player_id == "random":
            return random.Random(f"textarena-seat-{seed}").randrange(2)
        return int(self._player_id)

    # ---- the Env protocol ----

    async def reset(self, task: Task) -> list[Message]:
        game = task.metadata.get("game", self.game)
        if game != self.game:
            raise EnvError(f"textarena: task {task.id!r} is for game {game!r}, this env plays {self.game!r}")
        seed = task.metadata.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise EnvError(f"textarena: task {task.id!r} needs an integer metadata seed, got {seed!r}")
        await self.close()
        self._ta = _textarena()
        self._random_state, self._history, self._turns = None, {}, 0
        self._seat = self._seat_for(seed)
        self._wrapped = await self._call("make", self._ta.make, self.game, **self.game_kwargs)
        self._game = _unwrap(self._wrapped, self._ta)
        await self._call("reset", self._wrapped.reset, num_players=self.spec.num_players, seed=seed)
        self._opponent = self._opponents(seed) if self._opponents is not None else None
        self._done = False
        if await self._opponent_moves(False):
            ended: dict[str, Any] = {}
            await self._final_reward(ended)
            raise GameError(f"game {self.game} ended before the model's first move: {ended.get('reason')}")
        _, text = await self._take_observation()
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": text})
        return messages

    async def step(self, assistant_text: str) -> StepResult:
        if self._done or self._game is None:
            return StepResult([], 0.0, True, {"error": "step() called outside an episode"})
        self._turns += 1
        info: dict[str, Any] = {"game": self.game, "seat": self._seat, "turn": self._turns}
        done = await self._opponent_moves(await self._play(assistant_text))
        if done:
            self._done = True
            return StepResult([], await self._final_reward(info), True, info)
        player, text = await self._take_observation()
        if player != self._seat:
            raise GameError(
                f"game {self.game}: seat {player} to move, expected the model's seat {self._seat}"
            )
        if self._turns >= self.max_turns:
            info["truncated"] = True
        return StepResult([{"role": "user", "content": text}], 0.0, False, info)

    async def _final_reward(self, info: dict[str, Any]) -> float:
        closed = await self._call("close", self._wrapped.close)
        rewards, game_info = closed if isinstance(closed, tuple) else (closed, {})
        if not isinstance(rewards, dict) or self._seat not in rewards:
            raise GameError(f"game {self.game} ended without a reward for seat {self._seat}: {rewards!r}")
        seat_info = (game_info or {}).get(self._seat, {})
        info["game_rewards"] = {str(k): float(v) for k, v in rewards.items()}
        info["reason"] = None if seat_info.get("reason") is None else str(seat_info["reason"])
        info["invalid_move"] = bool(seat_info.get("invalid_move", False))
        return float(rewards[self._seat])

    async def close(self) -> None:
        self._done = True
        opponent, self._opponent = self._opponent, None
        if opponent is not None:
            await opponent.aclose()
