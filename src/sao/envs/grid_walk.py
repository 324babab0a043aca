"""``grid_walk``: walk a slippery grid from S to G around holes; reward 1 at the goal, 0 otherwise.

A long-horizon, sparse-terminal-reward, stochastic testbed (FrozenLake style) that a ~2M-parameter model can
learn: only an episode's last turn is rewarded, and the kwargs set its length (turn budgets of 10-30 with
the defaults; see the measured lengths at the end).

Layout (a task): a ``size`` x ``size`` grid, rows 0..size-1 top to bottom, cols 0..size-1 left to right;
positions are written ``row,col`` (``up`` is row − 1). `make_tasks` draws a start S, a goal G at Manhattan
distance >= ``min_dist``, and ``round(holes · size²)`` holes among the other cells, redrawing until a
hole-free path S → G exists (BFS). ``Task.metadata`` holds the layout as plain JSON (``size``, ``start``,
``goal``, ``holes`` as ``[row, col]`` lists, ``layout_seed``, and ``dist0``, the shortest hole-free path
length), so a task file written by `sao.envs.save_tasks_jsonl` reads back equal; ``answer`` is None. The
env plays whatever layout its task holds (`Layout.from_metadata`).

Formats (short: a byte-level tokenizer counts every character):

- a move:  ``move: right`` (the LAST ``move: up|down|left|right`` of the turn counts; case and spaces free);
- status:  ``at 2,3 goal 5,4 (3 down 1 right) holes: up,left`` — the walker's position, the goal and how
  far it lies in each direction, and which of the 4 neighbouring cells are holes (``holes: none``);
  prefixed ``slipped, `` when the move slipped. (The offset in words is there for small models: without
  it a ~2M-parameter model SFT-trained on 4,800 episodes did not learn to subtract positions and walked
  at random, winning 0 % of layouts its teacher won 18 % of.)
- ``view="local"`` (default): the first user message is ``6x6 grid, reach the goal, avoid holes; reply
  move: up|down|left|right`` and the status line; each later user message is the status line.
  ``view="map"``: every user message also draws the whole grid first, one line per row (``.`` free, ``O``
  hole, ``G`` goal, ``@`` walker): about 110 characters per turn at size 8, for long-context runs.
- a turn without a move: ``invalid, reply move: up|down|left|right`` (it uses up the turn).

Dynamics: with probability ``slip`` a move goes in one of the two perpendicular directions instead (half
each); a move off the grid leaves the walker in place. Entering a hole ends the episode with reward 0,
reaching G with reward 1, both with no observation; the turn budget ``max_turns`` = ``dist0`` + ``slack``
(set from the task at `reset`) ends it with reward 0. Every other turn's reward is 0. The final step's
``info`` has ``outcome`` (``goal`` / ``hole`` / ``budget``), ``turns``, ``slips``, ``dist0`` and
``episode_seed``; every step's has ``turn``, and ``move``/``went``/``pos`` when it had a move.

Turn budget and the run's cap: before any reset ``max_turns`` is the bound ``size² − 1 + slack`` (no
shortest path is longer), which is what the agent loop reads; assigning ``max_turns`` (as the run does with
``data.max_turns``) caps every later episode's budget: ``max_turns`` is then ``min(cap, dist0 + slack)``.
A task whose budget exceeds the bound (a layout larger than ``size``) is refused at reset.

Randomness: envs receive no per-episode seed from the agent loop (its seed drives the engine's sampling
only), and a run builds a fresh env per episode, so a per-instance counter alone would give every episode
of a task the same slips. The slip stream of an episode is ``random.Random`` seeded with the task's
``layout_seed`` (the task id for hand-made layouts) and an *episode seed*: ``seed + k`` for the k-th reset
of this instance when the ``seed`` kwarg is set (reproducible: tests, SFT data), else 63 fresh bits from
the OS (episodes of the same task differ; the value is in ``info["episode_seed"]``, and
``GridWalkEnv(seed=that)`` replays the episode's slips). Each turn draws the same two numbers whatever the
move, so the slip at turn t depends only on the seeds and t.

Scripted play: `shortest_move` (BFS next step avoiding holes) and `shortest_path_policy`. Because of slips
it does not always win, and it is not optimal (a walker that keeps off the sides of holes at the cost of a
longer path slips into fewer), so the optimal score is unknown and below 1. Measured over generated tasks
(1000 episodes, seeded): with the defaults (size 6, holes 0.15, min_dist 4, slip 0.2, slack 6) the
shortest-path walker wins 78 %, a uniformly random one 2-3 %; at size 8 (other kwargs default) 64-67 % and
under 1 %. Episodes then last 6-8 turns on average (at most ~20): for a longer horizon raise ``min_dist``
and lower ``holes`` (size 8, min_dist 10, holes 0.1, slack 8: ~11 turns on average for the shortest-path
walker, which wins 66 %). No ``score`` method: the outcome of a conversation depends on slips it does not
record.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from .base import Message, StepResult, Task, register_env

__all__ = [
    "DIRECTIONS",
    "INVALID",
    "PROMPT",
    "VIEWS",
    "GridWalkEnv",
    "Layout",
    "distances_to_goal",
    "goal_offset",
    "initial_text",
    "make_tasks",
    "move_text",
    "position",
    "render_map",
    "shortest_move",
    "shortest_path_policy",
    "status_line",
]

Cell = tuple[int, int]  # (row, col)
DIRECTIONS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_PERPENDICULAR = {"up": ("left", "right"), "down": ("left", "right"), "left": ("up", "down"),
                  "right": ("up", "down")}  # fmt: skip
VIEWS = ("local", "map")
INVALID = "invalid, reply move: up|down|left|right"
PROMPT = "{size}x{size} grid, reach the goal, avoid holes; reply move: up|down|left|right"
_MOVE = re.compile(r"\bmove\s*:\s*(up|down|left|right)\b", re.IGNORECASE)
_AT = re.compile(r"\bat (\d+),(\d+) goal")


@dataclass(frozen=True)
class Layout:
    """One grid: ``size``, ``start`` and ``goal`` cells, the ``holes``, and the ``seed`` it was drawn with
    (None for a hand-made one)."""

    size: int
    start: Cell
    goal: Cell
    holes: frozenset[Cell]
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 2:
            raise ValueError(f"layout size must be an integer >= 2, got {self.size!r}")
        for name, cell in (("start", self.start), ("goal", self.goal), *(("holes", h) for h in self.holes)):
            if not self.inside(cell):
                raise ValueError(f"layout {name} {cell!r} is not a cell of the {self.size}x{self.size} grid")
        if self.start in self.holes or self.goal in self.holes or self.start == self.goal:
            raise ValueError("layout start and goal must be distinct cells that are not holes")

    def inside(self, cell: Any) -> bool:
        return (
            isinstance(cell, tuple) and len(cell) == 2 and all(isinstance(x, int) for x in cell)
            and 0 <= cell[0] < self.size and 0 <= cell[1] < self.size
        )  # fmt: skip

    def to_metadata(self) -> dict[str, Any]:
        """Plain JSON (lists, not tuples; no ``layout_seed`` when None), so a task file reads back equal;
        with ``dist0``, the shortest hole-free path length (None when there is none)."""
        meta: dict[str, Any] = {
            "size": self.size,
            "start": list(self.start),
            "goal": list(self.goal),
            "holes": sorted([list(h) for h in self.holes]),
            "dist0": distances_to_goal(self).get(self.start),
        }
        return meta if self.seed is None else {**meta, "layout_seed": self.seed}

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> Layout:
        """The layout a task's metadata holds; ValueError names a missing or malformed field."""
        try:
            start, goal = _cell(meta["start"]), _cell(meta["goal"])
            holes = frozenset(_cell(h) for h in meta["holes"])
            size, seed = int(meta["size"]), meta.get("layout_seed")
            return cls(size, start, goal, holes, None if seed is None else int(seed))
        except (KeyError, TypeError) as err:
            raise ValueError(f"grid_walk task metadata needs size, start, goal and holes: {err!r}") from None


def _cell(value: Any) -> Cell:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"a grid_walk cell is [row, col], got {value!r}")
    return int(value[0]), int(value[1])


def distances_to_goal(layout: Layout) -> dict[Cell, int]:
    """Hole-free shortest path length from every cell that can reach the goal (BFS from the goal)."""
    dist = {layout.goal: 0}
    queue = deque([layout.goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DIRECTIONS.values():
            nxt = (r + dr, c + dc)
            if layout.inside(nxt) and nxt not in layout.holes and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def shortest_move(layout: Layout, pos: Cell) -> str | None:
    """The first move of a shortest hole-free path from ``pos`` to the goal (ties: up, down, left, right);
    None at the goal or where no path exists."""
    dist = distances_to_goal(layout)
    here = dist.get(pos)
    if not here:
        return None
    for name, (dr, dc) in DIRECTIONS.items():
        if dist.get((pos[0] + dr, pos[1] + dc)) == here - 1:
            return name
    return None  # unreachable: a cell at distance d has a neighbour at d - 1


def move_text(direction: str) -> str:
    """The canonical move turn."""
    return f"move: {direction}"


def _validate_shape(size: Any, holes: Any, min_dist: Any) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise ValueError(f"size must be an integer >= 2, got {size!r}")
    if isinstance(holes, bool) or not isinstance(holes, (int, float)) or not 0.0 <= holes < 1.0:
        raise ValueError(f"holes must be a fraction of the cells in [0, 1), got {holes!r}")
    if isinstance(min_dist, bool) or not isinstance(min_dist, int) or not 1 <= min_dist <= 2 * (size - 1):
        raise ValueError(
            f"min_dist must be an integer in [1, 2·(size − 1)] = [1, {2 * (size - 1)}], got {min_dist!r}"
        )


def _draw_layout(rng: random.Random, size: int, holes: float, min_dist: int, seed: int) -> Layout | None:
    """One candidate layout, or None when it has no hole-free path (the caller redraws)."""
    cells = [(r, c) for r in range(size) for c in range(size)]
    start = rng.choice(cells)
    far = [g for g in cells if abs(g[0] - start[0]) + abs(g[1] - start[1]) >= min_dist]
    if not far:
        return None
    goal = rng.choice(far)
    rest = [c for c in cells if c not in (start, goal)]
    layout = Layout(
        size, start, goal, frozenset(rng.sample(rest, min(len(rest), round(holes * size * size)))), seed
    )
    return layout if start in distances_to_goal(layout) else None


def goal_offset(layout: Layout, pos: Cell) -> str:
    """Where the goal lies from ``pos``, in moves: ``3 down 1 right``, ``2 up``, ``here``."""
    rows, cols = layout.goal[0] - pos[0], layout.goal[1] - pos[1]
    parts = [f"{abs(rows)} {'down' if rows > 0 else 'up'}"] if rows else []
    parts += [f"{abs(cols)} {'right' if cols > 0 else 'left'}"] if cols else []
    return " ".join(parts) or "here"


def status_line(layout: Layout, pos: Cell, slipped: bool = False) -> str:
    """``[slipped, ]at r,c goal r,c (3 down 1 right) holes: up,left`` (or ``holes: none``)."""
    near = [n for n, (dr, dc) in DIRECTIONS.items() if (pos[0] + dr, pos[1] + dc) in layout.holes]
    goal = f"goal {layout.goal[0]},{layout.goal[1]} ({goal_offset(layout, pos)})"
    text = f"at {pos[0]},{pos[1]} {goal} holes: {','.join(near) or 'none'}"
    return f"slipped, {text}" if slipped else text


def render_map(layout: Layout, pos: Cell) -> str:
    """The grid, one line per row: ``.`` free, ``O`` hole, ``G`` goal, ``@`` walker."""

    def mark(cell: Cell) -> str:
        return "@" if cell == pos else "G" if cell == layout.goal else "O" if cell in layout.holes else "."

    return "\n".join("".join(mark((r, c)) for c in range(layout.size)) for r in range(layout.size))


def _observation(layout: Layout, pos: Cell, view: str, slipped: bool = False) -> str:
    status = status_line(layout, pos, slipped)
    return f"{render_map(layout, pos)}\n{status}" if view == "map" else status


def initial_text(layout: Layout, view: str) -> str:
    """The first user message: the rules line, then the start's observation."""
    return f"{PROMPT.format(size=layout.size)}\n{_observation(layout, layout.start, view)}"


def make_tasks(
    n: int,
    seed: int = 0,
    size: int = 6,
    holes: float = 0.15,
    min_dist: int = 4,
    *,
    namespace: str = "grid_walk",
) -> list[Task]:
    """``n`` deterministic solvable layouts (see the module docstring); a longer list extends a shorter.

    ``namespace`` keys the draw and prefixes the ids (``grid_walk-<seed>-<i>``): the SFT generator uses
    its own, so its layouts are not the training ones. The turn budget's ``slack`` is a rule of play, the
    env's kwarg, not part of a task. ValueError names a bad argument, or says when 1000 draws of one task
    found no solvable layout (too many holes)."""
    _validate_shape(size, holes, min_dist)
    master = random.Random(f"{namespace}-{seed}-{size}-{holes}-{min_dist}")
    tasks = []
    for i in range(n):
        layout_seed = master.getrandbits(32)
        rng = random.Random(layout_seed)
        for _ in range(1000):
            layout = _draw_layout(rng, size, holes, min_dist, layout_seed)
            if layout is not None:
                break
        else:
            raise ValueError(
                f"holes={holes} leaves no solvable {size}x{size} layout with min_dist={min_dist}"
            )
        tasks.append(
            Task(
                id=f"{namespace}-{seed}-{i}",
                prompt=initial_text(layout, "local"),
                metadata=layout.to_metadata(),
            )
        )
    return tasks


def position(messages: list[Message]) -> Cell:
    """The walker's cell from the last status line (``at r,c``) in ``messages``."""
    for message in reversed(messages):
        found = _AT.findall(str(message.get("content") or "")) if message.get("role") == "user" else []
        if found:
            return int(found[-1][0]), int(found[-1][1])
    raise ValueError("no 'at row,col' status line in the messages")


def shortest_path_policy(task: Task) -> Any:
    """A policy (messages so far → next assistant text) that takes `shortest_move` from the current cell."""
    layout = Layout.from_metadata(task.metadata)
    return lambda messages: move_text(shortest_move(layout, position(messages)) or "up")


def _episode_rng(layout: Layout, task: Task, episode_seed: int) -> random.Random:
    key = layout.seed if layout.seed is not None else task.id
    return random.Random(f"grid_walk-{key}-{episode_seed}")


@register_env("grid_walk", tasks=make_tasks)
class GridWalkEnv:
    """See the module docstring. ``size``, ``holes``, ``min_dist``: the layouts `make_tasks` draws
    (``data.env_kwargs`` reach both; the env plays its task's layout, and ``size`` bounds ``max_turns``
    before a reset); ``slack``: budget turns beyond the shortest path; ``slip``: probability a move goes
    sideways; ``view``: ``local`` or ``map``; ``seed``: episode seeds ``seed + k`` (None: fresh entropy);
    ``system_prompt``: an optional system message."""

    def __init__(
        self,
        size: int = 6,
        holes: float = 0.15,
        min_dist: int = 4,
        slack: int = 6,
        slip: float = 0.2,
        view: str = "local",
        seed: int | None = None,
        system_prompt: str | None = None,
    ) -> None:
        _validate_shape(size, holes, min_dist)
        if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
            raise ValueError(f"slack must be an integer >= 0, got {slack!r}")
        if isinstance(slip, bool) or not isinstance(slip, (int, float)) or not 0.0 <= slip <= 1.0:
            raise ValueError(f"slip must be a probability in [0, 1], got {slip!r}")
        if view not in VIEWS:
            raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        self.size, self.slack, self.slip, self.view, self.seed = size, slack, float(slip), view, seed
        self.system_prompt = system_prompt
        self._bound = size * size - 1 + slack
        self._cap = self._bound
        self._budget = self._bound
        self._episodes = 0
        self._layout: Layout | None = None
        self._done = True

    @property
    def max_turns(self) -> int:
        """This episode's budget (the bound before a reset), capped by any value assigned."""
        return min(self._cap, self._budget)

    @max_turns.setter
    def max_turns(self, cap: int) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {cap!r}")
        self._cap = cap

    async def reset(self, task: Task) -> list[Message]:
        layout = Layout.from_metadata(task.metadata)
        dist0 = distances_to_goal(layout).get(layout.start)
        if dist0 is None:
            raise ValueError(f"task {task.id!r}: no hole-free path from start to goal")
        if dist0 + self.slack > self._bound:
            raise ValueError(
                f"task {task.id!r}: its budget {dist0 + self.slack} exceeds the bound {self._bound} that "
                f"size={self.size} gives; set size to the tasks' grid size ({layout.size})"
            )
        if self.seed is None:
            self.episode_seed = random.SystemRandom().getrandbits(63)
        else:
            self.episode_seed = self.seed + self._episodes
        self._episodes += 1
        self._rng = _episode_rng(layout, task, self.episode_seed)
        self._layout, self._pos, self._dist0, self._budget = layout, layout.start, dist0, dist0 + self.slack
        self._turns, self._slips, self._done = 0, 0, False
        messages: list[Message] = (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        )
        return [*messages, {"role": "user", "content": initial_text(layout, self.view)}]

    def _end(self, reward: float, outcome: str, info: dict[str, Any]) -> StepResult:
        self._done = True
        info.update(outcome=outcome, turns=self._turns, slips=self._slips, dist0=self._dist0,
                    episode_seed=self.episode_seed)  # fmt: skip
        return StepResult([], reward, True, info)

    async def step(self, assistant_text: str) -> StepResult:
        if self._done or self._layout is None:
            return StepResult([], 0.0, True, {"error": "step() called outside an episode"})
        layout = self._layout
        self._turns += 1
        info: dict[str, Any] = {"turn": self._turns}
        slip_draw, side_draw = self._rng.random(), self._rng.random()  # drawn every turn: see the docstring
        found = _MOVE.findall(assistant_text)
        slipped = False
        if not found:
            info["error"] = "no move in the turn"
            text = INVALID
        else:
            move = found[-1].lower()
            slipped = slip_draw < self.slip
            went = _PERPENDICULAR[move][side_draw < 0.5] if slipped else move
            self._slips += slipped
            dr, dc = DIRECTIONS[went]
            nxt = (self._pos[0] + dr, self._pos[1] + dc)
            if layout.inside(nxt):
                self._pos = nxt
            info.update(move=move, went=went, slipped=slipped, pos=list(self._pos))
            if self._pos in layout.holes:
                return self._end(0.0, "hole", info)
            if self._pos == layout.goal:
                return self._end(1.0, "goal", info)
            text = _observation(layout, self._pos, self.view, slipped)
        if self._turns >= self.max_turns:
            return self._end(0.0, "budget", info)
        return StepResult([{"role": "user", "content": text}], 0.0, False, info)

    async def close(self) -> None:
        self._done = True
