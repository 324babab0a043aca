"""The textarena env: real TextArena games driven by scripted assistant turns (no model)."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

pytest.importorskip("textarena")

from sao.envs import make_env, make_env_tasks
from sao.envs.base import EnvError, Task
from sao.envs.tasks import load_tasks, save_tasks_jsonl
from sao.envs.textarena_env import GameError, TextArenaEnv, make_tasks
from sao.envs.textarena_opponents import (
    RANDOM_MOVES,
    OpenAIOpponent,
    OpponentError,
    OpponentTurn,
    _openai_spec,
    legal_moves,
)

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def run(coro):
    return asyncio.run(coro)


async def play(env: TextArenaEnv, task: Task, policy, limit: int = 60):
    """Reset, then step ``policy(env, last_text)`` until done; returns (first messages, step results)."""
    first = await env.reset(task)
    text, results = first[-1]["content"], []
    try:
        for _ in range(limit):
            results.append(await env.step(policy(env, text)))
            if results[-1].done:
                break
            text = results[-1].observation[-1]["content"]
    finally:
        await env.close()
    return first, results


# ---- single-player: GuessTheNumber-v0 (1..20, 10 turns) ----


def bisect_policy():
    low, high, last = 1, 20, None

    def policy(env, text):
        nonlocal low, high, last
        if last is not None and "higher" in text:
            low = last + 1
        elif last is not None and "lower" in text:
            high = last - 1
        last = (low + high) // 2
        return f"I guess [{last}]"

    return policy


def test_single_player_game_won_by_binary_search_rewards_1():
    env = TextArenaEnv(game="GuessTheNumber-v0")
    task = make_tasks(1, seed=3, game="GuessTheNumber-v0")[0]
    first, results = run(play(env, task, bisect_policy()))
    assert first[0]["role"] == "user" and "[GAME] You are Player 0" in first[0]["content"]
    assert [r.reward for r in results[:-1]] == [0.0] * (len(results) - 1)
    assert all(r.observation[0]["content"].startswith("[GAME] The target number is") for r in results[:-1])
    final = results[-1]
    assert final.done and final.reward == 1.0 and len(results) <= 5
    assert final.info["game_rewards"] == {"0": 1.0} and "guessed the correct number" in final.info["reason"]
    assert final.info["game"] == "GuessTheNumber-v0" and final.info["seat"] == 0


def test_single_player_game_lost_at_the_turn_limit_keeps_the_games_partial_reward():
    env = TextArenaEnv(game="GuessTheNumber-v0", system_prompt="Answer [n].")
    task = make_tasks(1, seed=3, game="GuessTheNumber-v0")[0]
    target = run(_target(env, task))
    wrong = [n for n in range(1, 21) if n != target]
    guesses = iter(wrong)
    first, results = run(play(env, task, lambda env, text: f"[{next(guesses)}]"))
    assert first[0] == {"role": "system", "content": "Answer [n]."}
    # the game checks its 10-turn limit before counting the turn, so it ends on the 11th guess
    assert len(results) == 11 and results[-1].done and not any(r.done for r in results[:-1])
    expected = 1 - abs(wrong[10] - target) / 19  # the game's own "how close was the last guess"
    assert results[-1].reward == pytest.approx(expected) and results[-1].reward < 1
    assert "turn limit" in results[-1].info["reason"]


async def _target(env, task):
    await env.reset(task)
    target = env.textarena_env.game_number
    await env.close()
    return target


def test_an_invalid_move_is_the_games_observation_and_two_in_a_row_lose():
    env = TextArenaEnv(game="GuessTheNumber-v0")
    _, results = run(play(env, make_tasks(1, game="GuessTheNumber-v0")[0], lambda env, text: "no idea"))
    assert "attempted an invalid move" in results[0].observation[0]["content"] and not results[0].done
    assert results[1].done and results[1].info["invalid_move"] is True and len(results) == 2


def test_max_turns_marks_the_last_allowed_turn_truncated():
    env = TextArenaEnv(game="GuessTheNumber-v0", max_turns=2)
    task = make_tasks(1, seed=3, game="GuessTheNumber-v0")[0]
    target = run(_target(env, task))
    guesses = iter(n for n in range(1, 21) if n != target)
    _, results = run(play(env, task, lambda env, text: f"[{next(guesses)}]", limit=2))
    assert env.max_turns == 2 and [r.info.get("truncated", False) for r in results] == [False, True]
    assert not results[-1].done and results[-1].reward == 0.0


# ---- two-player: TicTacToe-v0 against the random opponent ----


def board_cells(env) -> list[str]:
    return [c for row in env.textarena_env.state.game_state["board"] for c in row]


def tictactoe_strong(env, text):
    """Win if possible, else block, else the centre, else the first free cell."""
    cells = board_cells(env)
    me = "X" if env.textarena_env.state.current_player_id == 1 else "O"
    free = [i for i, c in enumerate(cells) if c == ""]
    for mark in (me, "O" if me == "X" else "X"):
        for line in LINES:
            marks = [cells[i] for i in line]
            if marks.count(mark) == 2 and marks.count("") == 1:
                return f"[{line[marks.index('')]}]"
    return "[4]" if 4 in free else f"[{free[0]}]"


def tictactoe_weak(env, text):
    """The last free cell: never blocks."""
    return f"[{[i for i, c in enumerate(board_cells(env)) if c == ''][-1]}]"


def first_outcome(player_id, policy, reward):
    """The first of 40 TicTacToe tasks where ``policy`` ends with ``reward`` against the random opponent."""
    env = TextArenaEnv(game="TicTacToe-v0", opponent="random", player_id=player_id)
    for task in make_tasks(40, seed=0, game="TicTacToe-v0"):
        first, results = run(play(env, task, policy))
        if results[-1].reward == reward:
            return first, results
    raise AssertionError(f"no task ended with reward {reward}")


def test_two_player_win_against_the_random_opponent_rewards_plus_1():
    first, results = first_outcome(0, tictactoe_strong, 1.0)
    assert "Available Moves" in first[-1]["content"]
    final = results[-1]
    assert final.done and final.info["game_rewards"] == {"0": 1.0, "1": -1.0}
    assert final.info["reason"] == "Player 0 has won!" and final.info["seat"] == 0
    # the model's observations show the opponent's moves, not its own move echoed back
    middle = results[0].observation[0]["content"]
    assert "[Player 1] [" in middle and "[Player 0] [" not in middle


def test_two_player_loss_against_the_random_opponent_rewards_minus_1():
    first, results = first_outcome(1, tictactoe_weak, -1.0)
    assert "[Player 0] [" in first[-1]["content"]  # seat 1: the opponent moved before the first observation
    assert results[-1].info["game_rewards"] == {"0": 1.0, "1": -1.0}
    assert results[-1].info["reason"] == "Player 0 has won!"


def test_random_opponent_plays_only_legal_moves_in_every_supported_game():
    games = {
        "TicTacToeEnv": "TicTacToe-v0",
        "WildTicTacToeEnv": "WildTicTacToe-v0",
        "UltimateTicTacToeEnv": "UltimateTicTacToe-v0",
        "ConnectFourEnv": "ConnectFour-v0",
        "NimEnv": "Nim-v0",
        "KuhnPokerEnv": "KuhnPoker-v0",
        "OthelloEnv": "Othello-v0-small",
        "IteratedRockPaperScissorsEnv": "IteratedRockPaperScissors-v0",
        "IteratedMatchingPenniesEnv": "IteratedMatchingPennies-v0",
        "PigDiceEnv": "PigDice-v0-short",
    }
    assert set(games) == set(RANDOM_MOVES)
    for game in games.values():
        env = TextArenaEnv(game=game, opponent="random", player_id="random")
        for task in make_tasks(2, seed=1, game=game):
            # the model plays the first legal move, so any invalid move is a wrong legal-move list
            _, results = run(play(env, task, lambda env, text: legal_moves(env.textarena_env)[0], limit=400))
            state = env.textarena_env.state
            assert results[-1].done, game
            assert not any("attempted an invalid move" in text for _, text in state.logs), game
            assert not any(info["invalid_move"] for info in state.game_info.values()), game


def test_random_player_id_is_drawn_from_the_task_seed():
    env = TextArenaEnv(game="TicTacToe-v0", opponent="random", player_id="random")
    seats = []
    for task in make_tasks(12, seed=0, game="TicTacToe-v0"):
        _, results = run(play(env, task, tictactoe_strong, limit=1))
        seats.append(results[0].info["seat"])
    again = []
    for task in make_tasks(12, seed=0, game="TicTacToe-v0"):
        _, results = run(play(env, task, tictactoe_strong, limit=1))
        again.append(results[0].info["seat"])
    assert seats == again and set(seats) == {0, 1}


def test_an_episode_plays_as_the_raw_game_even_with_another_one_interleaved():
    """2048 spawns a random tile after every move, from the global random: each episode keeps its own
    stream, so its boards equal the raw TextArena game's with the same seed and moves."""
    import copy

    import textarena as ta

    game, moves = "2048-v0", ["[Left]", "[Up]", "[Right]", "[Down]"] * 4
    tasks = make_tasks(2, seed=4, game=game)
    raw = ta.make(game)
    raw.reset(num_players=1, seed=tasks[0].metadata["seed"])
    expected = []
    for move in moves:
        raw.step(move)
        expected.append(copy.deepcopy(raw.state.game_state["board"]))

    async def interleaved():
        a, b = TextArenaEnv(game=game), TextArenaEnv(game=game)
        await a.reset(tasks[0])
        await b.reset(tasks[1])
        boards = []
        for move in moves:
            await a.step(move)
            boards.append(copy.deepcopy(a.textarena_env.state.game_state["board"]))
            await b.step(move)
        return boards

    assert run(interleaved()) == expected


# ---- user-policy and OpenAI opponents ----

POLICY_FILE = """
import re

class LowestFree:
    seen = []

    def __call__(self, observation):
        LowestFree.seen.append(observation)
        return re.findall(r"Available Moves: '(\\[\\d\\])'", observation)[-1]

class Broken:
    def __call__(self, observation):
        raise RuntimeError("policy bug")
"""


def test_user_policy_opponent_from_a_file_gets_the_whole_game_as_text(tmp_path):
    path = tmp_path / "policy.py"
    path.write_text(POLICY_FILE)
    env = make_env("textarena", game="TicTacToe-v0", opponent=f"{path}:LowestFree", player_id=1)
    task = make_tasks(1, game="TicTacToe-v0")[0]
    first, results = run(play(env, task, tictactoe_strong))
    from sao.user_code import load_symbol

    seen = load_symbol(f"{path}:LowestFree").seen
    assert seen[0].startswith("\n[GAME] You are Player 0 in Tic Tac Toe")  # TextArena's LLMObservationWrapper
    assert "[Player 0] [0]" in first[-1]["content"]  # its lowest free cell, as the first move
    assert len(seen) >= 2 and "[Player 1] [" in seen[1]  # later calls include the model's moves
    assert results[-1].done


def test_user_policy_that_raises_raises_out_of_step(tmp_path):
    path = tmp_path / "policy.py"
    path.write_text(POLICY_FILE)
    env = TextArenaEnv(game="TicTacToe-v0", opponent=f"{path}:Broken")
    with pytest.raises(OpponentError, match=r"policy bug"):
        run(play(env, make_tasks(1, game="TicTacToe-v0")[0], tictactoe_strong))


def test_openai_opponent_plays_through_a_local_chat_server(serve_app):
    app, bodies = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        bodies.append(body)
        if len(bodies) == 2:  # one failure: the opponent retries
            return JSONResponse({"error": "busy"}, status_code=503)
        move = re.findall(r"Available Moves: '(\[\d\])'", body["messages"][-1]["content"])[-1]
        return {"choices": [{"message": {"role": "assistant", "content": f"I play {move}"}}]}

    url = serve_app(app)
    opponent = {"type": "openai", "base_url": url, "model": "frozen", "max_tokens": 16, "retries": 1}
    env = TextArenaEnv(game="TicTacToe-v0", opponent=opponent, player_id=1)
    first, results = run(play(env, make_tasks(1, game="TicTacToe-v0")[0], tictactoe_strong))
    assert results[-1].done and "[Player 0] I play [0]" in first[-1]["content"]
    assert bodies[0]["model"] == "frozen" and bodies[0]["max_tokens"] == 16
    roles = [m["role"] for m in bodies[-1]["messages"]]
    assert roles[:3] == ["user", "assistant", "user"] and roles[-1] == "user"
    assert bodies[-1]["messages"][1]["content"] == "I play [0]"  # its own moves are its assistant turns


def test_openai_opponent_that_keeps_failing_raises_after_its_retries():
    import httpx

    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(500, json={"error": "down"})

    spec = _openai_spec({"type": "openai", "base_url": "http://x", "model": "m", "retries": 1})
    opponent = OpenAIOpponent(spec, transport=httpx.MockTransport(handler))
    with pytest.raises(OpponentError, match=r"failed after 2 attempts"):
        run(opponent.act(OpponentTurn(1, "obs", "obs", None)))
    assert len(calls) == 2 and str(calls[0].url) == "http://x/v1/chat/completions"


def test_openai_opponent_spec_errors_name_the_key(monkeypatch):
    monkeypatch.delenv("SAO_TEST_NO_KEY", raising=False)
    base = {"type": "openai", "base_url": "http://x", "model": "m"}
    with pytest.raises(EnvError, match=r"unknown keys \['temprature'\]"):
        TextArenaEnv(game="TicTacToe-v0", opponent={**base, "temprature": 0.1})
    with pytest.raises(EnvError, match=r"opponent.model is required"):
        TextArenaEnv(game="TicTacToe-v0", opponent={"type": "openai", "base_url": "http://x"})
    with pytest.raises(EnvError, match=r"SAO_TEST_NO_KEY"):
        TextArenaEnv(game="TicTacToe-v0", opponent={**base, "api_key_env": "SAO_TEST_NO_KEY"})
    with pytest.raises(EnvError, match=r"opponent.timeout_s"):
        TextArenaEnv(game="TicTacToe-v0", opponent={**base, "timeout_s": "soon"})


# ---- construction, tasks, failures ----


def test_construction_refuses_bad_configurations_clearly(tmp_path):
    with pytest.raises(EnvError, match=r"unknown game 'TicTacToe-v9'; close ids: .*TicTacToe-v0"):
        TextArenaEnv(game="TicTacToe-v9")
    with pytest.raises(EnvError, match=r"two-player game; set data.env_kwargs.opponent"):
        TextArenaEnv(game="TicTacToe-v0")
    with pytest.raises(EnvError, match=r"single-player game; remove the opponent"):
        TextArenaEnv(game="GuessTheNumber-v0", opponent="random")
    with pytest.raises(EnvError, match=r"opponent 'random' needs the legal moves.*BattleshipEnv"):
        TextArenaEnv(game="Battleship-v0", opponent="random")
    with pytest.raises(EnvError, match=r"player_id must be 0, 1 or 'random'"):
        TextArenaEnv(game="TicTacToe-v0", opponent="random", player_id=2)
    with pytest.raises(EnvError, match=r"does not exist"):
        TextArenaEnv(game="TicTacToe-v0", opponent=f"{tmp_path}/none.py:P")
    with pytest.raises(EnvError, match=r"needs 3|set up 3 players|three players"):
        TextArenaEnv(game="ThreePlayerTicTacToe-v0", opponent="random")
    with pytest.raises(EnvError, match=r"cannot build environment 'textarena'.*game_kwargs"):
        make_env("textarena", game="TicTacToe-v0", game_kwargs=[1])


def _register(game_id: str, env_class) -> None:
    import textarena as ta
    from textarena.envs.registration import ENV_REGISTRY

    if game_id not in ENV_REGISTRY:
        ta.register(id=game_id, entry_point=env_class)


def test_a_game_that_cannot_start_here_is_refused_with_its_error():
    import textarena as ta

    class NeedsCorpus(ta.Env):
        def reset(self, num_players, seed=None):
            raise LookupError("Resource 'words' not found")

        def step(self, action):
            raise AssertionError

    _register("SaoNeedsCorpus-v0", NeedsCorpus)
    with pytest.raises(EnvError, match=r"needs NLTK data.*Resource 'words' not found"):
        TextArenaEnv(game="SaoNeedsCorpus-v0")


def test_an_exception_inside_the_game_raises_out_of_step():
    import textarena as ta

    class Explodes(ta.Env):
        def reset(self, num_players, seed=None):
            self.state = ta.SinglePlayerState(num_players=num_players, seed=seed)
            self.state.reset(game_state={}, player_prompt_function=lambda player_id, game_state: "Go.")

        def step(self, action):
            raise ZeroDivisionError("inside the game")

    _register("SaoExplodes-v0", Explodes)
    env = TextArenaEnv(game="SaoExplodes-v0")
    with pytest.raises(GameError, match=r"SaoExplodes-v0: step raised ZeroDivisionError: inside the game"):
        run(play(env, make_tasks(1, game="SaoExplodes-v0")[0], lambda env, text: "[1]"))


def test_a_slow_game_call_runs_off_the_event_loop():
    import textarena as ta

    class Slow(ta.Env):
        def reset(self, num_players, seed=None):
            time.sleep(0.3)  # a slow puzzle generator
            self.state = ta.SinglePlayerState(num_players=num_players, seed=seed)
            self.state.reset(game_state={}, player_prompt_function=lambda player_id, game_state: "Go.")

        def step(self, action):
            raise AssertionError

    _register("SaoSlow-v0", Slow)
    env = TextArenaEnv(game="SaoSlow-v0")

    async def ticks_during_reset():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        messages = await env.reset(make_tasks(1, game="SaoSlow-v0")[0])
        ticker.cancel()
        return ticks, messages

    ticks, messages = run(ticks_during_reset())
    assert ticks >= 10 and messages == [{"role": "user", "content": "[GAME] Go."}]


def test_make_tasks_is_deterministic_and_a_longer_list_extends_a_shorter():
    a = make_env_tasks("textarena", 256, seed=7, game="TicTacToe-v0", opponent="random", player_id=1)
    assert a == make_tasks(256, seed=7, game="TicTacToe-v0")
    assert make_tasks(10, seed=7, game="TicTacToe-v0") == a[:10]
    assert [t.metadata for t in make_tasks(3, seed=8, game="TicTacToe-v0")] != [t.metadata for t in a[:3]]
    assert all(set(t.metadata) == {"game", "seed"} and t.metadata["game"] == "TicTacToe-v0" for t in a)
    assert len({t.id for t in a}) == 256
    with pytest.raises(EnvError, match=r"game is required"):
        make_tasks(2, seed=0)
    with pytest.raises(EnvError, match=r"close ids"):
        make_tasks(2, seed=0, game="TicTacToe")


def test_a_task_file_round_trip_plays_the_same_game(tmp_path):
    tasks = make_tasks(3, seed=2, game="GuessTheNumber-v0")
    save_tasks_jsonl(tmp_path / "t.jsonl", tasks)
    loaded = load_tasks(tmp_path / "t.jsonl")
    assert loaded == tasks
    env = TextArenaEnv(game="GuessTheNumber-v0")
    assert [run(_target(env, t)) for t in loaded] == [run(_target(env, t)) for t in tasks]
    other = Task(id="x", prompt="p", metadata={"game": "TicTacToe-v0", "seed": 1})
    with pytest.raises(EnvError, match=r"is for game 'TicTacToe-v0'"):
        run(env.reset(other))


def test_an_episode_through_the_agent_loop(tiny_tokenizer):
    from sao.engine.types import Generation
    from sao.rollout.agent_loop import AgentLoopConfig, run_episode

    env = TextArenaEnv(game="GuessTheNumber-v0")
    task = make_tasks(1, seed=5, game="GuessTheNumber-v0")[0]
    eot = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")

    class Guesser:  # a wrong guess, then the number read from the game's state
        version = 0

        def __init__(self, env):
            self.env, self.turn = env, 0

        async def generate(self, prompt_ids, params):
            target = self.env.textarena_env.game_number
            text = f"[{target % 20 + 1}]" if self.turn == 0 else f"[{target}]"
            self.turn += 1
            ids = [*tiny_tokenizer.encode(text, add_special_tokens=False), eot]
            return Generation(ids, [-1.0] * len(ids), [0] * len(ids), "stop")

    traj = run(run_episode(Guesser(env), tiny_tokenizer, env, task, AgentLoopConfig(max_total_tokens=4000)))
    assert traj.rewards == [0.0, 1.0] and traj.finish_reason == "stop"
    assert traj.metadata["infos"][-1]["game_rewards"] == {"0": 1.0}
    text = tiny_tokenizer.decode(traj.token_ids)
    assert "Guess The Number" in text and "[GAME] The target number is" in text

    short = TextArenaEnv(game="GuessTheNumber-v0", max_turns=1)  # the bound ends it after the wrong guess
    traj = run(
        run_episode(Guesser(short), tiny_tokenizer, short, task, AgentLoopConfig(max_total_tokens=4000))
    )
    assert traj.rewards == [0.0] and traj.finish_reason == "max_turns"
    assert traj.metadata["infos"][-1]["truncated"] is True
