"""Opponents for two-player TextArena games: who plays the seat the trained model does not.

The spec is ``data.env_kwargs.opponent`` of the ``textarena`` env (`sao.envs.textarena_env`):

- ``"random"``: a uniformly random *legal* move, read from the game's state, for the games in
  `RANDOM_MOVES` (keyed by the TextArena env class, so every variant of a game id works: ``TicTacToe-v0``,
  ``ConnectFour-v0-blind``, ...). Any other game is refused at construction.
- ``"path/to/file.py:Name"`` / ``"package.module:Name"``: a user policy in TextArena's agent convention,
  ``policy(observation: str) -> str`` (plain or ``async``); ``observation`` is the seat's whole game so far
  in TextArena's ``LLMObservationWrapper`` text (``[GAME] ...``, ``[Player 0] ...`` lines), so any
  ``textarena.Agent`` subclass works as is. A class is instantiated (no arguments) once per episode; a
  plain function is called as is.
- ``{"type": "openai", "base_url": ..., "model": ..., ...}``: any OpenAI-compatible chat endpoint (e.g. a
  `sao serve` of a frozen model). It sees exactly what the trained model sees in its seat: a chat of
  ``user`` turns (what is new in the game) and its own ``assistant`` moves. Keys: see `OPENAI_KEYS`.

Every failure of an opponent (a user policy that raises or returns no string, an endpoint that still fails
after its retries, a game state without a legal move) raises `OpponentError`: the env lets it through, so
the agent loop drops the episode as ``env_error`` and the run goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from sao.envs.base import EnvError, Message
from sao.user_code import UserCodeError, load_symbol

__all__ = [
    "OPENAI_KEYS",
    "RANDOM_MOVES",
    "OpenAIOpponent",
    "Opponent",
    "OpponentError",
    "OpponentFactory",
    "OpponentTurn",
    "RandomOpponent",
    "UserPolicyOpponent",
    "legal_moves",
    "opponent_factory",
]


class OpponentError(RuntimeError):
    """An opponent that could not produce a move (its own failure, not a bad move: a bad move is the
    game's business)."""


@dataclass(frozen=True)
class OpponentTurn:
    """What an opponent gets when the game gives it the turn.

    ``observation``: the seat's whole game so far (TextArena ``LLMObservationWrapper`` text);
    ``new_text``: what is new since the seat last moved (its own moves left out), as the model gets it;
    ``game``: the unwrapped TextArena env, to read its state (do not modify it).
    """

    player_id: int
    observation: str
    new_text: str
    game: Any


class Opponent(Protocol):
    async def act(self, turn: OpponentTurn) -> str: ...

    async def aclose(self) -> None: ...


OpponentFactory = Callable[[int], Opponent]  # episode seed -> a fresh opponent for that episode


# ---- legal moves, per TextArena env class ----------------------------------------------------------------


def _tictactoe(game: Any) -> list[str]:
    board = game.state.game_state["board"]
    return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def _wild_tictactoe(game: Any) -> list[str]:
    board = game.state.game_state["board"]
    return [f"[{m} {r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == "" for m in "XO"]


def _ultimate_tictactoe(game: Any) -> list[str]:
    gs = game.state.game_state
    nxt = gs["next_micro_board"]
    return [
        f"[{macro} {cell}]"
        for macro in range(9)
        if (nxt is None or macro == nxt) and gs["macro_board"][macro // 3][macro % 3] == " "
        for cell in range(9)
        if gs["board"][macro][cell // 3][cell % 3] == " "
    ]


def _connect_four(game: Any) -> list[str]:
    top = game.state.game_state["board"][0]
    return [f"[col {c}]" for c in range(len(top)) if top[c] == "."]


def _nim(game: Any) -> list[str]:
    piles = game.state.game_state["piles"]
    return [f"[{i} {q}]" for i, n in enumerate(piles) for q in range(1, n + 1)]


def _kuhn_poker(game: Any) -> list[str]:
    tree = game.state.game_state["current_legal_action_tree"]
    return [f"[{k}]" for k in tree] if isinstance(tree, dict) else []


def _othello(game: Any) -> list[str]:
    piece = "B" if game.state.current_player_id == 0 else "W"
    moves = [f"[{r}, {c}]" for r, c in game._valid_moves(piece)]
    return moves or ["[pass]"]  # no legal placement: the game skips the turn whatever is sent


RANDOM_MOVES: dict[str, Callable[[Any], list[str]]] = {
    "TicTacToeEnv": _tictactoe,
    "WildTicTacToeEnv": _wild_tictactoe,
    "UltimateTicTacToeEnv": _ultimate_tictactoe,
    "ConnectFourEnv": _connect_four,
    "NimEnv": _nim,
    "KuhnPokerEnv": _kuhn_poker,
    "OthelloEnv": _othello,
    "IteratedRockPaperScissorsEnv": lambda game: ["[rock]", "[paper]", "[scissors]"],
    "IteratedMatchingPenniesEnv": lambda game: ["[heads]", "[tails]"],
    "PigDiceEnv": lambda game: ["[roll]", "[hold]"],
}


def legal_moves(game: Any) -> list[str]:
    """The legal moves of the player to move in ``game`` (an unwrapped TextArena env of a class in
    `RANDOM_MOVES`), as action texts."""
    return RANDOM_MOVES[type(game).__name__](game)


class RandomOpponent:
    """A uniformly random legal move, drawn from its own generator (seeded per episode)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"textarena-random-opponent-{seed}")

    async def act(self, turn: OpponentTurn) -> str:
        try:
            moves = legal_moves(turn.game)
        except Exception as err:
            raise OpponentError(f"random opponent: reading legal moves: {type(err).__name__}: {err}") from err
        if not moves:
            raise OpponentError("random opponent: the game gives the opponent the turn but has no legal move")
        return self._rng.choice(moves)

    async def aclose(self) -> None:
        return None


class UserPolicyOpponent:
    """A user policy ``policy(observation) -> str`` (TextArena's agent convention; see the module doc)."""

    def __init__(self, policy: Callable[[str], Any], source: str) -> None:
        self._policy, self._source = policy, source

    async def act(self, turn: OpponentTurn) -> str:
        try:
            action = self._policy(turn.observation)
            if inspect.isawaitable(action):
                action = await action
        except Exception as err:
            raise OpponentError(f"opponent {self._source!r} raised {type(err).__name__}: {err}") from err
        if not isinstance(action, str):
            raise OpponentError(f"opponent {self._source!r} returned {type(action).__name__}, not a string")
        return action

    async def aclose(self) -> None:
        return None


# ---- OpenAI-compatible endpoint -------------------------------------------------------------------------

# key -> (accepted types, default); base_url and model are required.
OPENAI_KEYS: dict[str, tuple[tuple[type, ...], Any]] = {
    "type": ((str,), "openai"),
    "base_url": ((str,), None),
    "model": ((str,), None),
    "api_key_env": ((str,), None),  # the name of the environment variable holding the key (None: no key)
    "timeout_s": ((int, float), 60.0),  # per request
    "max_tokens": ((int,), 256),  # per move
    "temperature": ((int, float), 1.0),
    "retries": ((int,), 2),  # further attempts after a failed request (network, HTTP error, bad body)
    "system_prompt": ((str,), None),  # an optional system message for the opponent's chat
}


@dataclass(frozen=True)
class _OpenAISpec:
    base_url: str
    model: str
    api_key: str | None
    timeout_s: float
    max_tokens: int
    temperature: float
    retries: int
    system_prompt: str | None


def _openai_spec(spec: dict[str, Any]) -> _OpenAISpec:
    unknown = sorted(set(spec) - set(OPENAI_KEYS))
    if unknown:
        raise EnvError(f"opponent: unknown keys {unknown}; an openai opponent takes {sorted(OPENAI_KEYS)}")
    values: dict[str, Any] = {}
    for key, (types, default) in OPENAI_KEYS.items():
        value = spec.get(key, default)
        if value is None and key in ("base_url", "model"):
            raise EnvError(f"opponent.{key} is required for an openai opponent")
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise EnvError(f"opponent.{key} must be {' or '.join(t.__name__ for t in types)}, got {value!r}")
        values[key] = value
    if values["timeout_s"] <= 0 or not math.isfinite(values["timeout_s"]):
        raise EnvError(f"opponent.timeout_s must be a positive number, got {values['timeout_s']!r}")
    if values["max_tokens"] < 1 or values["retries"] < 0 or values["temperature"] < 0:
        raise EnvError("opponent: max_tokens must be >= 1, retries >= 0 and temperature >= 0")
    api_key = None
    if values["api_key_env"] is not None:
        api_key = os.environ.get(values["api_key_env"])
        if not api_key:
            raise EnvError(f"opponent.api_key_env: environment variable {values['api_key_env']!r} is not set")
    base = values["base_url"].rstrip("/")
    return _OpenAISpec(
        base_url=base if base.endswith("/v1") else base + "/v1",
        model=values["model"],
        api_key=api_key,
        timeout_s=float(values["timeout_s"]),
        max_tokens=values["max_tokens"],
        temperature=float(values["temperature"]),
        retries=values["retries"],
        system_prompt=values["system_prompt"],
    )


class OpenAIOpponent:
    """A model behind ``POST {base_url}/v1/chat/completions``; its chat is kept for the episode.

    A request that fails (network error, timeout, HTTP error status, a body without
    ``choices[0].message``) is retried ``retries`` times (0.5 s, 1 s, ... apart); then `OpponentError`.
    ``transport``: an httpx transport (tests); default the network.
    """

    def __init__(self, spec: _OpenAISpec, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._spec = spec
        headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        self._client = httpx.AsyncClient(timeout=spec.timeout_s, headers=headers, transport=transport)
        self._chat: list[Message] = []
        if spec.system_prompt:
            self._chat.append({"role": "system", "content": spec.system_prompt})

    async def _request(self) -> str:
        body = {
            "model": self._spec.model,
            "messages": self._chat,
            "max_tokens": self._spec.max_tokens,
            "temperature": self._spec.temperature,
        }
        response = await self._client.post(self._spec.base_url + "/chat/completions", json=body)
        response.raise_for_status()
        message = response.json()["choices"][0]["message"]
        content = message.get("content")
        return "" if content is None else str(content)  # an empty move is the game's business

    async def act(self, turn: OpponentTurn) -> str:
        self._chat.append({"role": "user", "content": turn.new_text})
        error: Exception | None = None
        for attempt in range(self._spec.retries + 1):
            if attempt:
                await asyncio.sleep(0.5 * 2 ** (attempt - 1))
            try:
                action = await self._request()
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as err:
                error = err
                continue
            self._chat.append({"role": "assistant", "content": action})
            return action
        raise OpponentError(
            f"openai opponent {self._spec.model!r} at {self._spec.base_url} failed after "
            f"{self._spec.retries + 1} attempts: {type(error).__name__}: {error}"
        )

    async def aclose(self) -> None:
        await self._client.aclose()


# ---- from the config's spec --------------------------------------------------------------------------------


def _user_policy_factory(source: str) -> OpponentFactory:
    try:
        symbol = load_symbol(source)
    except UserCodeError as err:
        raise EnvError(f"opponent {source!r}: {err}") from None
    if not callable(symbol):
        raise EnvError(f"opponent {source!r} is not callable (expected a class or a function)")

    def build(seed: int) -> Opponent:
        if not inspect.isclass(symbol):
            return UserPolicyOpponent(symbol, source)
        try:
            policy = symbol()
        except Exception as err:
            raise OpponentError(f"opponent {source!r}: {type(err).__name__}: {err}") from err
        if not callable(policy):
            raise OpponentError(f"opponent {source!r}: an instance is not callable as policy(observation)")
        return UserPolicyOpponent(policy, source)

    return build


def opponent_factory(
    spec: Any, game_class: str, *, transport: httpx.AsyncBaseTransport | None = None
) -> OpponentFactory:
    """Check ``spec`` (see the module docstring) for a game whose TextArena env class is ``game_class``
    and return ``seed -> Opponent`` (one fresh opponent per episode). Raises `EnvError` on a bad spec."""
    if spec == "random":
        if game_class not in RANDOM_MOVES:
            known = ", ".join(sorted(c.removesuffix("Env") for c in RANDOM_MOVES))
            raise EnvError(
                f"opponent 'random' needs the legal moves of the game, which sao reads only for: {known}; "
                f"this game's env class is {game_class}: use a user policy ('file.py:Class') or an "
                "openai opponent"
            )
        return RandomOpponent
    if isinstance(spec, str) and ":" in spec:
        return _user_policy_factory(spec)
    if isinstance(spec, dict):
        if spec.get("type") != "openai":
            raise EnvError(f"opponent: a mapping needs type: openai, got type {spec.get('type')!r}")
        checked = _openai_spec(spec)
        return lambda seed: OpenAIOpponent(checked, transport)
    raise EnvError(
        f"opponent must be 'random', 'path/file.py:Class' / 'module:Class', or a mapping with "
        f"type: openai; got {spec!r}"
    )
