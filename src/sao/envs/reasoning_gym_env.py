"""``reasoning_gym``: procedural reasoning tasks from the reasoning-gym library, scored by its own verifiers.

Needs the library (``pip install 'sao[reasoning-gym]'``); this module imports it lazily, so sao imports
without it, and building the env without it raises `EnvError` with that command.

Configuration (``data.env_kwargs``):

- ``datasets``: the families to generate tasks from, either a list of reasoning-gym dataset names (weight
  1 each, the library's default config) or a mapping ``name -> {weight: float > 0 (default 1), config:
  {...}}`` whose ``config`` holds the family's config-class fields (difficulty knobs, e.g. ``max_digits``);
  ``seed`` and ``size`` are set by sao and refused there. Checked when the env is built: an unknown name, an
  unknown config key, a config the library refuses, or a family whose entries do not survive JSON (they
  are written to task files) is an `EnvError` naming the family. Needed only to generate tasks
  (`ReasoningGymEnv.make_tasks`); tasks read from a file carry their family and config themselves.
- ``system_prompt``: a name of the library's ``reasoning_gym.utils.SYSTEM_PROMPTS`` (``"default"``, the
  default; ``"direct"``, ``"simple"``, ``"DeepSeekZero"``, ``"chain_of_draft"``), which selects that text,
  or any other string, used verbatim; ``None`` or ``""``: no system message.
- ``answer_tag``: the tag the answer is read from (default ``"answer"``, the library's convention).

Tasks (`ReasoningGymEnv.make_tasks(n, seed, datasets)`): each task's family is drawn by weight from
``random.Random("rg:<seed>:mix")``; family ``f`` gets a library dataset whose seed is a 32-bit hash of
``("rg", seed, f)`` and its ``k``-th task of the call is that dataset's entry ``k``. So the tasks depend on
``(n, seed, datasets)`` only (and, for the families that seed entry ``k`` from ``seed + k``, as nearly all
do, a longer list extends a shorter one). Task ``id`` ``"rg<seed>-<i>-<name>"``,
``prompt`` the entry's question, ``answer`` its answer; ``metadata``: ``dataset`` (the family),
``dataset_config`` and ``entry_metadata`` (the config and the entry's own metadata, as JSON text so that
any task-file format keeps them exact; tuples become lists).

One turn: ``reset`` returns the system message (if any) and the question; ``step`` reads the answer from
the **last** ``<answer>...</answer>`` of the reply (the library's ``extract_answer``: the text may span
lines, surrounding whitespace is stripped) and the reward is the library's ``score_answer(answer,
entry)`` of the task's family, in [0, 1]: exact answers 1, and many families give partial credit
(``chain_sum``: the right number inside a longer answer earns ``len(right) / len(answer)``). A reply with
no complete tag pair scores 0 without asking the library, with ``info["no_answer"] = True``. ``info``:
``dataset``, ``answer`` (the extracted text, cut to 200 characters, or None), ``no_answer``. The library
raising in ``score_answer`` or returning anything but a finite number in [0, 1] raises
`ReasoningGymScoreError` (the agent loop drops the episode as ``env_error``): no reward is made up.
`ReasoningGymEnv.score` grades an external agent's conversation the same way from its final assistant
message (0.0 for a malformed conversation; a task that is not a reasoning_gym task raises `EnvError`).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import numbers
import random
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from .base import EnvError, Message, StepResult, Task, initial_messages, message_text, register_env
from .extras import install_command, require_library

__all__ = [
    "INSTALL_HINT",
    "FamilySpec",
    "ReasoningGymEnv",
    "ReasoningGymScoreError",
    "extract_answer",
    "generate_tasks",
    "parse_datasets",
    "resolve_system_prompt",
    "score_reply",
]

INSTALL_HINT = install_command("reasoning_gym")
_SET_BY_SAO = ("seed", "size")  # dataset config fields sao sets per task batch
_SPEC_KEYS = ("weight", "config")
_TAG = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # interpolated into the library's regex unescaped
_INFO_ANSWER_CHARS = 200


class ReasoningGymScoreError(RuntimeError):
    """The library's scorer raised or returned something other than a finite number in [0, 1]."""


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """One family of the mix: its dataset ``name``, mixing ``weight`` and ``config`` as canonical JSON."""

    name: str
    weight: float
    config_json: str


def _library() -> Any:
    """The ``reasoning_gym`` package, or `EnvError` with the install command."""
    return require_library("reasoning_gym")


def _registry() -> dict[str, tuple[type, type]]:
    """The library's dataset table: name -> (dataset class, config dataclass)."""
    _library()
    from reasoning_gym.factory import DATASETS

    return DATASETS


def _as_json(value: Any, what: str) -> str:
    """``value`` as JSON text, or `EnvError` naming ``what``."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise EnvError(f"{what} is not JSON-serialisable: {err}") from None


def _check_name(name: Any) -> str:
    registry = _registry()
    if not isinstance(name, str) or name not in registry or name == "composite":
        if name == "composite":
            raise EnvError("reasoning-gym dataset 'composite' is refused: list its families in `datasets`")
        close = difflib.get_close_matches(str(name), list(registry), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise EnvError(f"unknown reasoning-gym dataset {name!r}{hint} (reasoning_gym.factory.DATASETS)")
    return name


def _check_config(name: str, config: Any) -> str:
    """The family's config as canonical JSON, its keys checked against the library's config class."""
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise EnvError(
            f"reasoning-gym dataset {name!r}: config must be a mapping, got {type(config).__name__}"
        )
    fields = [f.name for f in dataclasses.fields(_registry()[name][1])]
    for key in config:
        if key in _SET_BY_SAO:
            raise EnvError(f"reasoning-gym dataset {name!r}: config key {key!r} is set by sao, remove it")
        if key not in fields:
            known = ", ".join(f for f in fields if f not in _SET_BY_SAO)
            raise EnvError(f"reasoning-gym dataset {name!r}: unknown config key {key!r}; known: {known}")
    text = _as_json(dict(config), f"config of reasoning-gym dataset {name!r}")
    return json.dumps(json.loads(text), sort_keys=True)


def parse_datasets(datasets: Any) -> tuple[FamilySpec, ...]:
    """The validated mix: a list of names, or a mapping ``name -> {weight, config}`` (see the module
    docstring). Each family is built once per process and checked on a sample entry (`_family_check`)."""
    if isinstance(datasets, str) or not isinstance(datasets, Mapping | Sequence) or not datasets:
        raise EnvError(
            f"datasets must be a non-empty list of names or mapping of name -> spec, got {datasets!r}"
        )
    items = list(datasets.items()) if isinstance(datasets, Mapping) else [(n, None) for n in datasets]
    specs: list[FamilySpec] = []
    for name, spec in items:
        name = _check_name(name)
        if any(s.name == name for s in specs):
            raise EnvError(f"reasoning-gym dataset {name!r} is listed more than once")
        spec = {} if spec is None else spec
        if not isinstance(spec, Mapping):
            raise EnvError(f"reasoning-gym dataset {name!r}: spec must be a mapping {{weight, config}}")
        unknown = sorted(set(spec) - set(_SPEC_KEYS), key=str)
        if unknown:
            raise EnvError(f"reasoning-gym dataset {name!r}: unknown keys {unknown}; known: weight, config")
        weight = spec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not 0 < weight < math.inf:
            raise EnvError(
                f"reasoning-gym dataset {name!r}: weight must be a finite number > 0, got {weight!r}"
            )
        config_json = _check_config(name, spec.get("config"))
        _family_check(name, config_json)
        specs.append(FamilySpec(name, float(weight), config_json))
    return tuple(specs)


def _create(name: str, config_json: str, seed: int, size: int) -> Any:
    """A library dataset of family ``name``; `EnvError` naming it if the library refuses the config."""
    lib = _library()
    try:
        return lib.create_dataset(name, **json.loads(config_json), seed=seed, size=size)
    except Exception as err:  # the config classes validate with assert
        raise EnvError(f"reasoning-gym dataset {name!r} refused config {config_json}: {err!r}") from None


@lru_cache(maxsize=256)
def _scorer(name: str, config_json: str) -> Any:
    """The dataset whose ``score_answer`` grades family ``name`` (one per process and config)."""
    return _create(name, config_json, seed=0, size=1)


def _entry_json(name: str, entry: Any) -> tuple[str, Any, str]:
    """(question, answer, entry metadata JSON) of a library entry, or `EnvError` naming the family."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("question"), str) or "answer" not in entry:
        raise EnvError(f"reasoning-gym dataset {name!r} made an entry without a question and answer")
    answer = json.loads(_as_json(entry["answer"], f"the answer of a reasoning-gym {name!r} entry"))
    meta = _as_json(entry.get("metadata", {}), f"the metadata of a reasoning-gym {name!r} entry")
    return entry["question"], answer, meta


@lru_cache(maxsize=256)
def _family_check(name: str, config_json: str) -> None:
    """Build the family and check, on one entry, that it survives JSON: the library scores its own answer
    the same with the JSON-read entry as with the original (once per process and config)."""
    dataset = _scorer(name, config_json)
    entry = dataset[0]
    question, answer, meta = _entry_json(name, entry)
    copy = {"question": question, "answer": answer, "metadata": json.loads(meta)}
    if _library_score(dataset, name, entry["answer"], copy) != _library_score(
        dataset, name, entry["answer"], entry
    ):
        raise EnvError(f"reasoning-gym dataset {name!r}: its entries do not survive JSON, it cannot be used")


def _dataset_seed(namespace: str, seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{namespace}:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def generate_tasks(n: int, seed: int, specs: Sequence[FamilySpec], namespace: str = "rg") -> list[Task]:
    """``n`` tasks mixed from ``specs`` by weight, deterministic in ``(n, seed, specs, namespace)`` (see the
    module docstring; ``namespace`` separates independent streams, e.g. the SFT recipe's)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise EnvError(f"seed must be an integer, got {seed!r}")
    if not specs:
        raise EnvError("reasoning_gym needs at least one dataset to generate tasks from")
    mix = random.Random(f"{namespace}:{seed}:mix")
    picks = mix.choices(range(len(specs)), weights=[s.weight for s in specs], k=n)
    counts = [picks.count(j) for j in range(len(specs))]
    datasets = [
        _create(s.name, s.config_json, _dataset_seed(namespace, seed, s.name), max(c, 1))
        for s, c in zip(specs, counts, strict=True)
    ]
    taken = [0] * len(specs)
    tasks = []
    for i, j in enumerate(picks):
        spec = specs[j]
        question, answer, meta = _entry_json(spec.name, datasets[j][taken[j]])
        taken[j] += 1
        metadata = {"dataset": spec.name, "dataset_config": spec.config_json, "entry_metadata": meta}
        tasks.append(Task(f"{namespace}{seed}-{i}-{spec.name}", question, answer, metadata=metadata))
    return tasks


def extract_answer(text: str, tag: str = "answer") -> str | None:
    """The library's reading of a reply: the stripped text of the last ``<tag>...</tag>``, or None."""
    _library()
    from reasoning_gym.utils import extract_answer as library_extract

    return library_extract(text, tag_name=tag)


def _library_score(dataset: Any, name: str, answer: str | None, entry: Mapping[str, Any]) -> float:
    try:
        value = dataset.score_answer(answer, entry)
    except Exception as err:
        raise ReasoningGymScoreError(f"reasoning-gym {name!r} score_answer raised {err!r}") from err
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise ReasoningGymScoreError(f"reasoning-gym {name!r} score_answer returned {value!r}, not in [0, 1]")
    return float(value)


def _task_family(task: Task) -> tuple[str, Any, dict[str, Any]]:
    """(family name, its scorer dataset, the library entry) of a task made by `generate_tasks`."""
    meta = task.metadata
    name, config_json, entry_meta = (meta.get(k) for k in ("dataset", "dataset_config", "entry_metadata"))
    if not all(isinstance(v, str) for v in (name, config_json, entry_meta)):
        raise EnvError(
            f"task {task.id!r} is not a reasoning_gym task: its metadata needs dataset, dataset_config and "
            "entry_metadata (JSON text), as ReasoningGymEnv.make_tasks writes them"
        )
    try:
        config, entry_metadata = json.loads(config_json), json.loads(entry_meta)
    except json.JSONDecodeError as err:
        raise EnvError(f"task {task.id!r}: metadata is not valid JSON: {err}") from None
    dataset = _scorer(_check_name(name), _check_config(name, config))
    return name, dataset, {"question": task.prompt, "answer": task.answer, "metadata": entry_metadata}


def score_reply(task: Task, text: str, tag: str = "answer") -> tuple[float, dict[str, Any]]:
    """The reward and info of ``text`` as the final reply to ``task`` (see the module docstring)."""
    name, dataset, entry = _task_family(task)
    answer = extract_answer(text, tag)
    info: dict[str, Any] = {"dataset": name, "answer": None, "no_answer": answer is None}
    if answer is None:
        return 0.0, info
    info["answer"] = answer[:_INFO_ANSWER_CHARS]
    return _library_score(dataset, name, answer, entry), info


def resolve_system_prompt(system_prompt: str | None, answer_tag: str = "answer") -> str | None:
    """The system message text: a ``SYSTEM_PROMPTS`` name selects the library's text; None/"" none."""
    if system_prompt is None or system_prompt == "":
        return None
    if not isinstance(system_prompt, str):
        raise EnvError(f"system_prompt must be a string or None, got {type(system_prompt).__name__}")
    _library()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if system_prompt not in SYSTEM_PROMPTS:
        return system_prompt
    if answer_tag != "answer":
        raise EnvError(
            f"system_prompt {system_prompt!r} asks for <answer> tags but answer_tag is {answer_tag!r}; "
            "write a system prompt that names your tag"
        )
    return SYSTEM_PROMPTS[system_prompt]


@register_env("reasoning_gym")
class ReasoningGymEnv:
    """See the module docstring. One episode at a time; one turn per episode."""

    name = "reasoning_gym"
    max_turns = 1

    def __init__(
        self,
        datasets: Sequence[str] | Mapping[str, Any] | None = None,
        system_prompt: str | None = "default",
        answer_tag: str = "answer",
    ) -> None:
        _library()
        if not isinstance(answer_tag, str) or not _TAG.fullmatch(answer_tag):
            raise EnvError(f"answer_tag must be a tag name (letters, digits, _ or -), got {answer_tag!r}")
        self.answer_tag = answer_tag
        self.system_prompt = resolve_system_prompt(system_prompt, answer_tag)
        self.families = parse_datasets(datasets) if datasets is not None else ()
        self._task: Task | None = None

    @classmethod
    def make_tasks(
        cls, n: int, seed: int = 0, datasets: Sequence[str] | Mapping[str, Any] | None = None
    ) -> list[Task]:
        """``n`` tasks of the ``datasets`` mix (the env's ``datasets`` argument); see `generate_tasks`."""
        if datasets is None:
            raise EnvError("reasoning_gym generates tasks from data.env_kwargs.datasets; none are set")
        return generate_tasks(n, seed, parse_datasets(datasets))

    async def reset(self, task: Task) -> list[Message]:
        _task_family(task)  # a task from elsewhere fails here, before the model plays it
        self._task = task
        return initial_messages(task, self.system_prompt)

    async def step(self, assistant_text: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() called outside an episode")
        task, self._task = self._task, None
        reward, info = score_reply(task, assistant_text, self.answer_tag)
        return StepResult([], reward, True, info)

    def score(self, task: Task, messages: list[Message]) -> float:
        """The reward `step` gives the final assistant message of ``messages`` (0.0 when the conversation
        is malformed or ends otherwise); the episode in progress, if any, is not touched."""
        final = messages[-1] if isinstance(messages, list) and messages else None
        if not isinstance(final, dict) or final.get("role") != "assistant":
            return 0.0
        return score_reply(task, message_text(final), self.answer_tag)[0]

    async def close(self) -> None:
        self._task = None
