"""Drawing one synthetic instance (`sao.envs.swe_synth`): a package, a bug, its tests, its row.

`make_row` draws row ``index`` from its own random stream: a family (families take turns), how many of
its modules, a depth and a mutation kind; `PackageDraw` holds the package, the call distances between
its functions and random calls of each function; `first_good_mutation` tries a few mutations at once
(`sao.envs.swe_synth_check.evaluate`) and `build_instance` turns the first that breaks the tested
function into hidden and visible tests, diffs and a problem statement, kept only when pytest agrees.
This module does not validate knobs or write the JSONL file (`sao.envs.swe_synth` does).
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sao.envs.swe_instance import DEFAULT_TEST_CMD, default_repo_dir
from sao.envs.swe_mutations import Mutation, apply_mutation, find_mutations
from sao.envs.swe_packages import FAMILIES, Family
from sao.envs.swe_synth_check import Case, Outcome, evaluate, run_pytest
from sao.envs.swe_synth_render import problem_statement, render_tests, scaffold, unified_diff
from sao.envs.swe_synth_repo import commit_repo, write_tree

if TYPE_CHECKING:
    from sao.envs.swe_synth import Knobs

__all__ = [
    "GENERATOR_VERSION",
    "SYNTH_TEST_CMD",
    "Candidate",
    "PackageDraw",
    "build_instance",
    "call_graph",
    "first_good_mutation",
    "make_row",
]

GENERATOR_VERSION = "synth-2"  # synth-2: rows' test_cmd without plugin autoloading
CREATED_AT = "2025-01-01T00:00:00Z"
CASES_PER_FUNCTION = 8
CANDIDATES_PER_DRAW = 6
MAX_DRAWS = 40
HIDDEN_FAILING, HIDDEN_PASSING, VISIBLE_PER_FUNCTION = 3, 2, 2
HIDDEN_PATH = "tests/test_regressions.py"
# The generated repositories need no pytest plugins; autoloading the interpreter's costs ~0.8 s a run.
SYNTH_TEST_CMD = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {DEFAULT_TEST_CMD}"

_Test = tuple[str, Case, Outcome]  # (test name, call, expected outcome)
_Ids = tuple[list[str], list[str]]  # (FAIL_TO_PASS, PASS_TO_PASS) node ids


def call_graph(package: str, sources: Mapping[str, str]) -> dict[str, set[str]]:
    """``{"module.function": {"module.function" it calls directly}}`` over the package's top-level functions
    (calls by bare name to a function of the same module or one imported from another module)."""
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        tree = ast.parse(source)
        names = {n.name: f"{module}.{n.name}" for n in tree.body if isinstance(n, ast.FunctionDef)}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module[len(package) + 1 :]}.{alias.name}"
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                called = {
                    names[c.func.id]
                    for c in ast.walk(node)
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in names
                }
                graph[f"{module}.{node.name}"] = called
    return graph


def _distances(graph: dict[str, set[str]]) -> dict[str, dict[str, int]]:
    """``{caller: {callee: fewest calls}}`` (each function reaches itself in 0), breadth-first."""
    distance = {}
    for start in graph:
        seen, frontier = {start: 0}, [start]
        while frontier:
            reached = []
            for caller in frontier:
                for callee in sorted(graph[caller] - seen.keys()):
                    seen[callee] = seen[caller] + 1
                    reached.append(callee)
            frontier = reached
        distance[start] = seen
    return distance


@dataclass
class PackageDraw:
    """A package drawn for one attempt: the first modules of a family, its call distances and cases."""

    family: Family
    sources: dict[str, str]  # module name -> correct source
    distance: dict[str, dict[str, int]]  # caller -> {callee: fewest calls}, over "module.function"
    cases: list[Case]

    @classmethod
    def of(cls, rng: random.Random, family: Family, n_files: int) -> PackageDraw:
        """The first ``n_files`` modules of ``family`` and `CASES_PER_FUNCTION` draws of each function's
        arguments (repeated draws kept once)."""
        sources = dict(family.modules[:n_files])
        graph = call_graph(family.package, sources)
        distance = _distances(graph)
        cases: list[Case] = []
        for function in graph:
            drawn = [family.inputs[function](rng) for _ in range(CASES_PER_FUNCTION)]
            cases += {repr(args): Case(function, args) for args in drawn}.values()
        return cls(family, sources, distance, cases)

    def callers(self, function: str, depth: int) -> set[str]:
        """The functions exactly ``depth`` calls above ``function``."""
        return {f for f, seen in self.distance.items() if seen.get(function) == depth}

    def sites(self, depth: int, kind: str) -> list[tuple[str, Mutation]]:
        """``(module, mutation)`` of ``kind`` in a function some function calls ``depth`` calls away."""
        return [
            (module, m)
            for module, source in self.sources.items()
            for m in find_mutations(source, [kind])
            if self.callers(f"{module}.{m.function}", depth)
        ]


@dataclass(frozen=True)
class Candidate:
    """A mutation of ``module`` and what it did to the draw's cases: ``ref`` / ``got`` the outcomes on the
    correct / mutated code, ``failing`` the usable cases of the tested functions it breaks, ``passing``
    the usable cases it leaves right (indexes into the draw's cases)."""

    module: str
    mutation: Mutation
    ref: list[Outcome]
    got: list[Outcome]
    failing: list[int]
    passing: list[int]


class _TestNames:
    """Test names ``test_<function><suffix>_<n>``, numbered from 1 per function and suffix."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, case: Case, suffix: str = "") -> str:
        self.counts[case.name + suffix] += 1
        return f"test_{case.name}{suffix}_{self.counts[case.name + suffix]}"


def _spread(indexes: Sequence[int], cases: Sequence[Case], count: int) -> list[int]:
    """Up to ``count`` of ``indexes``, shortest call first, one function at a time in turn."""
    by_function: dict[str, list[int]] = {}
    for i in sorted(indexes, key=lambda i: (len(cases[i].call), i)):
        by_function.setdefault(cases[i].function, []).append(i)
    picked: list[int] = []
    while len(picked) < count and any(by_function.values()):
        for queue in by_function.values():
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


def _visible_tests(
    draw: PackageDraw, cand: Candidate, hidden_pass: list[int], names: _TestNames
) -> dict[str, list[_Test]]:
    """``{module: tests}``: per function, up to `VISIBLE_PER_FUNCTION` passing cases with distinct
    expected values, none of them a hidden test; modules without any are left out."""
    cases, ref = draw.cases, cand.ref
    by_module = {}
    for m in draw.sources:
        tests = []
        for function in (f for f in draw.distance if f.startswith(m + ".")):
            chosen, seen = [], set()
            for i in cand.passing:
                if cases[i].function == function and i not in hidden_pass and ref[i].text not in seen:
                    chosen.append(i)
                    seen.add(ref[i].text)
            tests += [(names(cases[i]), cases[i], ref[i]) for i in chosen[:VISIBLE_PER_FUNCTION]]
        if tests:
            by_module[m] = tests
    return by_module


def _confirmed(tmp: Path, package: str, trees: tuple[dict[str, str], dict[str, str]], ids: _Ids) -> bool:
    """Whether pytest, on the ``(buggy, fixed)`` trees (written under ``tmp``), fails every FAIL_TO_PASS
    and passes every PASS_TO_PASS test of ``ids`` on the bug, and passes them all on the fix."""
    f2p, p2p = ids
    write_tree(tmp / "buggy", trees[0])
    write_tree(tmp / "fixed", trees[1])
    before, after = run_pytest(package, [tmp / "buggy", tmp / "fixed"])
    if any(before.get(t) != "FAILED" for t in f2p) or any(before.get(t) != "PASSED" for t in p2p):
        return False
    return all(after.get(t) == "PASSED" for t in f2p + p2p)


def _metadata(draw: PackageDraw, cand: Candidate, depth: int, hidden_fail: list[int]) -> dict[str, Any]:
    """The row's ``synth`` column: where the bug is and what the failing hidden tests call."""
    return {
        "family": draw.family.package,
        "files": len(draw.sources),
        "depth": depth,
        "kind": cand.mutation.kind,
        "module": cand.module,
        "function": cand.mutation.function,
        "line": cand.mutation.line,
        "mutation": cand.mutation.description,
        "tested": sorted({draw.cases[i].function for i in hidden_fail}),
    }


def build_instance(
    rng: random.Random, draw: PackageDraw, cand: Candidate, depth: int, tmp: Path
) -> dict[str, Any] | None:
    """Tests, issue and diffs for one candidate that fails some cases (the repository's ``files``, the
    row's text fields and ``synth``); None unless pytest confirms the hidden tests fail on the bug and
    pass on the fix and the rest pass on both. Draws the problem statement's wording from ``rng``."""
    package, cases, ref, module = draw.family.package, draw.cases, cand.ref, cand.module
    tested = draw.callers(f"{module}.{cand.mutation.function}", depth)
    hidden_fail = _spread(cand.failing, cases, HIDDEN_FAILING)
    hidden_pass = _spread([i for i in cand.passing if cases[i].function in tested], cases, HIDDEN_PASSING)
    names = _TestNames()
    hidden_tests = [(names(cases[i], "_regression"), cases[i], ref[i]) for i in hidden_fail + hidden_pass]
    hidden = render_tests(package, "Tests for the reported issue.", hidden_tests)
    files = scaffold(draw.family, list(draw.sources))
    buggy = apply_mutation(draw.sources[module], cand.mutation)
    files.update({f"{package}/{m}.py": buggy if m == module else s for m, s in draw.sources.items()})
    visible_ids = []
    for m, tests in _visible_tests(draw, cand, hidden_pass, names).items():
        files[f"tests/test_{m}.py"] = render_tests(package, f"Tests of {package}.{m}.", tests)
        visible_ids += [f"tests/test_{m}.py::{name}" for name, _, _ in tests]
    f2p = [f"{HIDDEN_PATH}::{name}" for name, _, _ in hidden_tests[: len(hidden_fail)]]
    p2p = visible_ids + [f"{HIDDEN_PATH}::{name}" for name, _, _ in hidden_tests[len(hidden_fail) :]]
    fixed = {**files, f"{package}/{module}.py": draw.sources[module]}
    trees = ({**files, HIDDEN_PATH: hidden}, {**fixed, HIDDEN_PATH: hidden})
    if not _confirmed(tmp, package, trees, (f2p, p2p)):
        return None
    shown = [(cases[i], ref[i], cand.got[i]) for i in hidden_fail[:2]]
    return {
        "files": files,
        "problem_statement": problem_statement(rng, package, shown),
        "patch": unified_diff(f"{package}/{module}.py", buggy, draw.sources[module]),
        "test_patch": unified_diff(HIDDEN_PATH, "", hidden),
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "synth": _metadata(draw, cand, depth, hidden_fail),
    }


def _write_variants(draw: PackageDraw, candidates: Sequence[tuple[str, Mutation]], roots: list[Path]) -> None:
    """The package under ``roots[0]`` as drawn, under ``roots[j + 1]`` with ``candidates[j]`` applied."""
    package = draw.family.package
    for root, mutated in zip(roots, [None, *candidates], strict=True):
        files = {f"{package}/__init__.py": ""}
        for m, source in draw.sources.items():
            is_mutated = mutated is not None and mutated[0] == m
            files[f"{package}/{m}.py"] = apply_mutation(source, mutated[1]) if is_mutated else source
        write_tree(root, files)


def first_good_mutation(
    rng: random.Random,
    draw: PackageDraw,
    depth: int,
    candidates: Sequence[tuple[str, Mutation]],
    tmp: Path,
) -> dict[str, Any] | None:
    """The first of ``candidates`` (``(module, mutation)``) that makes a good instance (see
    `build_instance`), or None. A candidate is skipped when a case times out on it or when it breaks no
    case of the functions ``depth`` calls above the mutated one; cases whose outcome a test cannot write
    down are not used."""
    roots = [tmp / f"tree{j}" for j in range(len(candidates) + 1)]
    _write_variants(draw, candidates, roots)
    outcomes = evaluate(draw.family.package, roots, draw.cases)
    ref = outcomes[0]
    usable = [i for i, o in enumerate(ref) if o.kind != "timeout" and o.literal]
    for j, (module, mutation) in enumerate(candidates):
        got = outcomes[j + 1]
        if any(got[i].kind == "timeout" for i in usable):
            continue
        tested = draw.callers(f"{module}.{mutation.function}", depth)
        failing = [i for i in usable if not got[i].ok and draw.cases[i].function in tested]
        passing = [i for i in usable if got[i].ok]
        if failing:
            cand = Candidate(module, mutation, ref, got, failing, passing)
            built = build_instance(rng, draw, cand, depth, tmp / f"check{j}")
            if built is not None:
                return built
    return None


def _row(index: int, family: Family, built: dict[str, Any], out: Path) -> dict[str, Any]:
    """The JSONL row of a built instance, its repository committed under ``out/repos/``."""
    repo = f"synth/{family.package}-{index:04d}"
    repo_dir = out / "repos" / default_repo_dir(repo)
    commit = commit_repo(repo_dir, built.pop("files"), f"{family.package} {GENERATOR_VERSION}")
    row = {
        "instance_id": default_repo_dir(repo),
        "repo": repo,
        "base_commit": commit,
        "problem_statement": built.pop("problem_statement"),
        **built,
        "created_at": CREATED_AT,
        "version": GENERATOR_VERSION,
        "repo_path": str(repo_dir.relative_to(out)),
        "test_cmd": SYNTH_TEST_CMD,
    }
    row["synth"] = row.pop("synth")
    return row


def make_row(index: int, seed: int, knobs: Knobs, out: Path, tmp: Path) -> dict[str, Any]:
    """Row ``index`` (its own random stream: the first rows do not depend on ``n``), its repository made
    under ``out`` and scratch trees under ``tmp``. Raises ValueError after `MAX_DRAWS` failed draws."""
    rng = random.Random(f"sao-swe-synth:{seed}:{index}")
    eligible = [f for f in FAMILIES if len(f.modules) >= knobs.files[0]]
    order = list(eligible)
    random.Random(f"sao-swe-synth:{seed}").shuffle(order)
    for attempt in range(MAX_DRAWS):
        # The first half of the draws keeps this row's share of kinds and depths (cycling with the index);
        # families take turns, so a batch spreads over all of them.
        family = order[(index + attempt) % len(order)]
        n_files = rng.randint(knobs.files[0], min(knobs.files[1], len(family.modules)))
        first_half = attempt < MAX_DRAWS // 2
        span = knobs.depth[1] - knobs.depth[0] + 1
        depth = knobs.depth[0] + index % span if first_half else rng.randint(*knobs.depth)
        kind = knobs.kinds[index % len(knobs.kinds)] if first_half else rng.choice(knobs.kinds)
        draw = PackageDraw.of(rng, family, n_files)
        sites = draw.sites(depth, kind)
        if not sites:
            continue
        candidates = rng.sample(sites, min(CANDIDATES_PER_DRAW, len(sites)))
        built = first_good_mutation(rng, draw, depth, candidates, tmp / f"attempt{attempt}")
        if built is not None:
            return _row(index, family, built, out)
    raise ValueError(
        f"no instance {index} after {MAX_DRAWS} draws with files={knobs.files}, depth={knobs.depth}, "
        f"kinds={list(knobs.kinds)}: widen the knobs (deep bugs need several files)"
    )
