"""The grid_walk env: parsing, hand-checked walks on a fixed layout, slips, endings, the turn budget, task
generation, the scripted policies' success rates and the SFT generator."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from sao.envs import ENV_TASKS, EnvError, make_env, make_env_tasks
from sao.envs.base import Task
from sao.envs.grid_walk import (
    INVALID,
    GridWalkEnv,
    Layout,
    distances_to_goal,
    goal_offset,
    make_tasks,
    position,
    shortest_move,
    shortest_path_policy,
)
from sao.envs.grid_walk_sft import SFT_NAMESPACE, grid_walk_conversations, main
from sao.envs.sft_data import play_episode
from sao.envs.tasks import load_tasks, save_tasks_jsonl

from .scripted import play_scripted

# S . . .      start 0,0; goal 3,3; holes 1,1 and 2,3; shortest path 6 (down the left column, then right)
# . O . .
# . . . O
# . . . G
LAYOUT = Layout(4, (0, 0), (3, 3), frozenset({(1, 1), (2, 3)}))
TASK = Task(id="hand", prompt="p", metadata=LAYOUT.to_metadata())


def walk(turns: list[str], **kwargs):
    return play_scripted(GridWalkEnv(**kwargs), TASK, turns)


def contents(results) -> list[str]:
    return [r.observation[0]["content"] if r.observation else "" for r in results]


def test_a_hand_checked_walk_reaches_the_goal_cell_by_cell_with_reward_1():
    moves = ["move: right", "move: right", "move: down", "move: down", "move: down", "move: right"]
    first, results = walk(moves, slip=0.0)
    assert first == [{"role": "user", "content": "4x4 grid, reach the goal, avoid holes; reply move: "
                      "up|down|left|right\nat 0,0 goal 3,3 (3 down 3 right) holes: none"}]  # fmt: skip
    assert contents(results) == [
        "at 0,1 goal 3,3 (3 down 2 right) holes: down",
        "at 0,2 goal 3,3 (3 down 1 right) holes: none",
        "at 1,2 goal 3,3 (2 down 1 right) holes: left",
        "at 2,2 goal 3,3 (1 down 1 right) holes: right",
        "at 3,2 goal 3,3 (1 right) holes: none",
        "",
    ]
    assert [r.reward for r in results] == [0.0] * 5 + [1.0]
    assert [r.done for r in results] == [False] * 5 + [True]
    assert {k: results[-1].info[k] for k in ("outcome", "turns", "slips", "dist0")} == {
        "outcome": "goal", "turns": 6, "slips": 0, "dist0": 6}  # fmt: skip


def test_entering_a_hole_ends_the_episode_with_reward_0_and_says_why():
    _, results = walk(["move: right", "move: down", "move: down"], slip=0.0)
    assert len(results) == 2 and results[-1].done and results[-1].reward == 0.0
    assert results[-1].observation == [] and results[-1].info["outcome"] == "hole"
    assert results[-1].info["pos"] == [1, 1] and results[-1].info["turns"] == 2


def test_a_move_off_the_grid_leaves_the_walker_in_place():
    _, results = walk(["move: up", "move: left"], slip=0.0)
    assert contents(results) == ["at 0,0 goal 3,3 (3 down 3 right) holes: none"] * 2


@pytest.mark.parametrize(
    ("text", "went"),
    [
        ("move: up then MOVE :  Right", "right"),
        ("I could move: left, no: move:down", "down"),
        ("Move:RIGHT", "right"),
    ],
)
def test_the_last_move_of_the_turn_counts_whatever_its_case_and_spaces(text, went):
    _, (result,) = walk([text], slip=0.0)
    assert result.info["move"] == went == result.info["went"]


@pytest.mark.parametrize("text", ["right", "moves: right", "move: upward", "remove: up", ""])
def test_a_turn_without_a_valid_move_is_answered_invalid_and_uses_the_turn(text):
    _, (bad, good) = walk([text, "move: right"], slip=0.0)
    assert bad.observation == [{"role": "user", "content": INVALID}] and not bad.done and "error" in bad.info
    assert INVALID == "invalid, reply move: up|down|left|right"
    assert good.info["turn"] == 2 and good.info["pos"] == [0, 1]


def test_slip_1_always_goes_perpendicular_to_one_side_or_the_other():
    seen = set()
    for seed in range(30):
        _, (result,) = walk(["move: down"], slip=1.0, seed=seed)
        assert result.info["went"] in ("left", "right") and result.info["slipped"]
        expected = (
            "at 0,1 goal 3,3 (3 down 2 right) holes: down"
            if result.info["went"] == "right"
            else "at 0,0 goal 3,3 (3 down 3 right) holes: none"
        )
        assert contents([result]) == [f"slipped, {expected}"]
        seen.add(result.info["went"])
    assert seen == {"left", "right"}


def test_running_out_of_turns_ends_with_reward_0_and_outcome_budget():
    env = GridWalkEnv(slack=2, slip=0.0)
    _, results = play_scripted(env, TASK, ["move: up", "nothing"] * 10)
    assert env.max_turns == 8 == len(results)  # dist0 6 + slack 2
    assert [r.reward for r in results] == [0.0] * 8 and [r.done for r in results] == [False] * 7 + [True]
    assert results[-1].info["outcome"] == "budget" and results[-1].info["turns"] == 8


def test_the_run_cap_on_max_turns_holds_across_resets_and_the_bound_is_set_before_any():
    env = GridWalkEnv(size=6, slack=6)
    assert env.max_turns == 6 * 6 - 1 + 6  # no shortest path on a 6x6 grid is longer
    env.max_turns = 3  # what the run does with data.max_turns
    _, results = play_scripted(env, TASK, ["move: up"] * 10)
    assert env.max_turns == 3 == len(results) and results[-1].info["outcome"] == "budget"
    with pytest.raises(ValueError, match="size=2"):
        play_scripted(GridWalkEnv(size=2, min_dist=1, slack=0), TASK, [])  # a 4x4 task, bound 3


def _went(env: GridWalkEnv, turns: list[str], task: Task) -> list[str | None]:
    return [r.info.get("went") for r in play_scripted(env, task, turns)[1]]


def test_slips_are_reproducible_with_a_seed_and_differ_between_episodes():
    open_task = Task(
        id="open", prompt="p", metadata=Layout(6, (0, 0), (5, 5), frozenset(), seed=9).to_metadata()
    )
    lefts = ["move: left"] * 12  # slips go up (stay) or down; the goal stays out of reach
    first = _went(GridWalkEnv(slip=0.5, seed=3), lefts, open_task)
    assert first == _went(GridWalkEnv(slip=0.5, seed=3), lefts, open_task)
    env = GridWalkEnv(slip=0.5, seed=3)
    assert _went(env, lefts, open_task) == first and _went(env, lefts, open_task) != first  # seed 3, then 4
    unseeded = GridWalkEnv(slip=0.5)
    assert _went(unseeded, lefts, open_task) != _went(unseeded, lefts, open_task)
    # each turn draws the same numbers whatever the move: an invalid first turn leaves the later slips alone
    assert _went(GridWalkEnv(slip=0.5, seed=3), ["hi", *lefts[1:]], open_task)[1:] == first[1:]


def test_the_map_view_draws_the_grid_every_turn():
    first, results = walk(["move: right"], slip=0.0, view="map")
    assert first[0]["content"].splitlines()[1:] == [
        "@...",
        ".O..",
        "...O",
        "...G",
        "at 0,0 goal 3,3 (3 down 3 right) holes: none",
    ]
    assert results[0].observation[0]["content"] == (
        ".@..\n.O..\n...O\n...G\nat 0,1 goal 3,3 (3 down 2 right) holes: down"
    )


def test_shortest_move_follows_a_bfs_path_around_the_holes():
    assert distances_to_goal(LAYOUT)[(0, 0)] == 6 and (1, 1) not in distances_to_goal(LAYOUT)
    assert shortest_move(LAYOUT, (0, 0)) == "down"  # ties (down, right) go up, down, left, right
    assert shortest_move(LAYOUT, (1, 2)) == "down" and shortest_move(LAYOUT, (2, 2)) == "down"
    assert shortest_move(LAYOUT, (3, 2)) == "right" and shortest_move(LAYOUT, (3, 3)) is None
    history = [
        {"role": "user", "content": "at 0,0 goal 3,3"},
        {"role": "user", "content": INVALID},
        {"role": "user", "content": "slipped, at 2,1 goal 3,3 holes: none"},
    ]
    assert position(history) == (2, 1)


def test_goal_offset_names_each_direction_with_its_distance():
    wide = Layout(6, (0, 0), (2, 5), frozenset())
    assert goal_offset(wide, (0, 0)) == "2 down 5 right" and goal_offset(wide, (4, 5)) == "2 up"
    assert goal_offset(wide, (2, 1)) == "4 right" and goal_offset(wide, (3, 5)) == "1 up"
    assert goal_offset(Layout(6, (5, 5), (0, 0), frozenset()), (5, 5)) == "5 up 5 left"
    assert goal_offset(wide, (2, 5)) == "here"


def test_make_tasks_is_deterministic_extends_and_every_layout_is_solvable():
    tasks = make_tasks(200, seed=1)
    assert tasks == make_tasks(200, seed=1) and make_tasks(20, seed=1) == tasks[:20]
    assert tasks[0].id == "grid_walk-1-0" and make_tasks(20, seed=2) != tasks[:20]
    assert make_tasks(20, seed=1, namespace=SFT_NAMESPACE)[0].id == "grid_walk-sft-1-0"
    for task in tasks:
        layout = Layout.from_metadata(task.metadata)
        start, goal = layout.start, layout.goal
        assert layout.size == 6 and len(layout.holes) == round(0.15 * 36)
        assert abs(start[0] - goal[0]) + abs(start[1] - goal[1]) >= 4
        assert distances_to_goal(layout).get(start) == task.metadata["dist0"] >= 4
    assert len({json.dumps(t.metadata, sort_keys=True) for t in tasks}) == 200


def test_generated_tasks_round_trip_through_a_task_file_and_the_registry(tmp_path):
    tasks = make_env_tasks("grid_walk", 10, 3, size=8, min_dist=6, slip=0.1, view="map")
    assert ENV_TASKS["grid_walk"] is make_tasks and tasks == make_tasks(10, 3, size=8, min_dist=6)
    save_tasks_jsonl(tmp_path / "t.jsonl", tasks)
    assert load_tasks(tmp_path / "t.jsonl") == tasks
    env = make_env("grid_walk", size=8, view="map")
    assert isinstance(env, GridWalkEnv) and env.name == "grid_walk"


@pytest.mark.parametrize(
    ("kwarg", "value"),
    [("size", 1), ("size", True), ("holes", 1.0), ("holes", -0.1), ("min_dist", 0), ("min_dist", 11),
     ("slack", -1), ("slip", 1.5), ("view", "full"), ("seed", "x")],
)  # fmt: skip
def test_bad_kwargs_are_errors_naming_the_kwarg(kwarg, value):
    with pytest.raises(ValueError, match=kwarg):
        GridWalkEnv(**{kwarg: value})
    with pytest.raises(EnvError, match=kwarg):
        make_env("grid_walk", **{kwarg: value})


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ({"size": 4}, "needs size, start, goal and holes"),
        ({"size": 4, "start": [0], "goal": [1, 1], "holes": []}, r"\[row, col\]"),
        ({"size": 4, "start": [0, 0], "goal": [1, 1], "holes": [[0, 0]]}, "not holes"),
        ({"size": 4, "start": [0, 0], "goal": [4, 1], "holes": []}, "not a cell"),
    ],
)
def test_malformed_task_metadata_is_a_clear_error(meta, match):
    with pytest.raises(ValueError, match=match):
        Layout.from_metadata(meta)


def test_too_many_holes_for_a_solvable_layout_is_an_error():
    with pytest.raises(ValueError, match=r"holes=0\.95"):
        make_tasks(1, 0, holes=0.95)


def _success(policy_for, n: int = 300, **kwargs) -> float:
    env = GridWalkEnv(seed=0, **kwargs)

    async def run() -> list[float]:
        return [(await play_episode(env, t, policy_for(t)))[1] for t in make_tasks(n, seed=5)]

    rewards = asyncio.run(run())
    return sum(rewards) / len(rewards)


def test_the_shortest_path_policy_wins_most_episodes_but_slips_cost_it_some():
    rng = random.Random(0)
    shortest = _success(shortest_path_policy)
    randomly = _success(lambda _t: lambda _m: f"move: {rng.choice(['up', 'down', 'left', 'right'])}")
    assert 0.7 <= shortest <= 0.9 and randomly <= 0.08  # measured: 0.78 and 0.02 with the defaults
    assert _success(shortest_path_policy, n=100, slip=0.0) == 1.0


def test_the_sft_generator_writes_replayable_move_conversations_between_random_and_shortest(tmp_path, capsys):
    out = tmp_path / "chats.jsonl"
    main(["--n", "300", "--seed", "4", "--out", str(out)])
    assert "won" in capsys.readouterr().out
    chats = [json.loads(line)["messages"] for line in out.read_text().splitlines()]
    again, rewards = grid_walk_conversations(300, seed=4)
    assert len(chats) == 300 and chats == again
    assert 0.15 <= sum(rewards) / 300 <= 0.6 and 0.0 in rewards  # measured: 0.36; losses are kept
    env = GridWalkEnv(seed=4)  # the generator's env: episode k has seed 4 + k, so a replay is exact
    for task, messages in zip(make_tasks(300, 4, namespace=SFT_NAMESPACE), chats, strict=True):
        assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)
        moves = [m["content"] for m in messages if m["role"] == "assistant"]
        assert all(m in ("move: up", "move: down", "move: left", "move: right") for m in moves)
        first, results = play_scripted(env, task, moves)
        assert first == messages[:1]
        assert contents(results[:-1]) == [m["content"] for m in messages[2::2]]
