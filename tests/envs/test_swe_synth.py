"""The synthetic SWE instance generator: every generated instance's hidden tests fail on its base commit
and pass with the reference patch, the visible tests pass on both, generation is deterministic, and the
mutations are small, valid edits of the kinds asked for."""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sao.envs.swe_instance import DEFAULT_TEST_CMD, instance_from_task, load_instances, repo_files
from sao.envs.swe_mutations import KINDS, apply_mutation, find_mutations
from sao.envs.swe_packages import FAMILIES, template_source
from sao.envs.swe_synth import GENERATOR_VERSION, Knobs, generate_instances, main, make_tasks
from sao.envs.swe_synth_check import Case, evaluate
from sao.envs.swe_synth_draw import call_graph

BATCH = 8
# sha256 of the batch's instances.jsonl: a change of any row (templates, drawing, rendering, commits) must
# come with a new GENERATOR_VERSION (generated directories are reused by version) and a new digest here.
BATCH_ROWS_SHA256 = "ae809027cb946c0e46d9453f1bd1d57010691134d5a3695e1dd20eff9cfe6614"


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Eight instances, the four kinds twice, depths 0 to 2, two to five modules."""
    out = tmp_path_factory.mktemp("synth")
    return out, generate_instances(BATCH, seed=7, out_dir=out, files="2-5", depth="0-2")


def _checkout(inst, dest: Path) -> Path:
    """The repository at base_commit in ``dest`` (git archive: the repository itself is not touched)."""
    dest.mkdir()
    archive = subprocess.run(
        ["git", "-C", inst.repo_path, "archive", inst.base_commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def _apply(patch: str, root: Path) -> None:
    subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=root, check=True, capture_output=True)


def _run_test_cmd(inst, root: Path, args) -> subprocess.CompletedProcess[str]:
    """The instance's ``test_cmd`` with ``args`` appended, under ``bash -c`` as the sandbox runs it, with
    this interpreter first on PATH as ``python`` (as in the sandbox)."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    command = inst.test_cmd + "".join(" " + shlex.quote(a) for a in args)
    return subprocess.run(
        ["bash", "-c", command], cwd=root, capture_output=True, text=True, env=env, timeout=300
    )


def _run_tests(inst, root: Path, node_ids) -> dict[str, str]:
    """``{node id: PASSED/FAILED/ERROR}`` from the instance's test command."""
    out = _run_test_cmd(inst, root, node_ids).stdout
    return {
        rest.split(" - ")[0]: word
        for word, _, rest in (line.partition(" ") for line in out.splitlines())
        if word in ("PASSED", "FAILED", "ERROR")
    }


def test_hidden_tests_fail_on_the_base_commit_and_pass_with_the_reference_patch(batch, tmp_path):
    _, instances = batch
    for n, inst in enumerate(instances):
        root = _checkout(inst, tmp_path / f"i{n}")
        _apply(inst.test_patch, root)
        before = _run_tests(inst, root, inst.FAIL_TO_PASS + inst.PASS_TO_PASS)
        assert {before[t] for t in inst.FAIL_TO_PASS} == {"FAILED"}, inst.instance_id
        assert {before[t] for t in inst.PASS_TO_PASS} == {"PASSED"}, inst.instance_id
        _apply(inst.patch, root)
        after = _run_tests(inst, root, inst.FAIL_TO_PASS + inst.PASS_TO_PASS)
        assert set(after) == set(inst.FAIL_TO_PASS + inst.PASS_TO_PASS), inst.instance_id
        assert set(after.values()) == {"PASSED"}, inst.instance_id


def test_the_rows_test_command_loads_no_pytest_plugins(batch, tmp_path):
    _, instances = batch
    plugins = {e.value for e in importlib.metadata.entry_points(group="pytest11")}
    if "_hypothesis_pytestplugin" not in plugins:
        pytest.skip("hypothesis' pytest plugin is not installed: nothing would be autoloaded")
    root = _checkout(instances[0], tmp_path / "checkout")
    assert instances[0].test_cmd != DEFAULT_TEST_CMD
    # The plugin's option is unknown to pytest exactly when the plugin was not loaded.
    run = _run_test_cmd(instances[0], root, ["--hypothesis-show-statistics", "tests"])
    assert run.returncode == 4 and "unrecognized arguments: --hypothesis-show-statistics" in run.stderr
    with_plugins = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics"],
        cwd=root,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"},
        timeout=300,
    )
    assert with_plugins.returncode == 0, with_plugins.stdout + with_plugins.stderr


def test_a_batch_mixes_every_kind_and_the_asked_depths(batch):
    _, instances = batch
    synth = [inst.extra["synth"] for inst in instances]
    assert sorted(s["kind"] for s in synth) == sorted(KINDS * 2)
    assert {s["depth"] for s in synth} == {0, 1, 2}
    assert all(2 <= s["files"] <= 5 for s in synth)
    assert len({s["family"] for s in synth}) >= 4


def test_the_repository_holds_the_bug_and_the_visible_tests_only(batch):
    out, instances = batch
    for inst in instances:
        assert Path(inst.repo_path).parent == out / "repos"
        log = subprocess.run(
            ["git", "-C", inst.repo_path, "log", "--all", "--format=%H"], capture_output=True, text=True
        )
        assert log.stdout.split() == [inst.base_commit]  # no fix anywhere in the history
        status = subprocess.run(["git", "-C", inst.repo_path, "status", "--porcelain"], capture_output=True)
        assert status.stdout == b""
        files = repo_files(inst)
        assert "tests/test_regressions.py" not in files
        assert any(path.startswith("tests/test_") for path in files)
        module = f"{inst.extra['synth']['family']}/{inst.extra['synth']['module']}.py"
        assert f"a/{module}" in inst.patch.splitlines()[0]  # the fix touches the mutated module only
        assert inst.patch.count("diff --git") == 1


def test_the_problem_statement_shows_a_failing_call_but_not_where_the_bug_is(batch):
    _, instances = batch
    for inst in instances:
        synth, text = inst.extra["synth"], inst.problem_statement
        tested = [t.split(".")[1] for t in synth["tested"]]
        assert any(f"{name}(" in text for name in tested), text
        assert re.search(r"(returns|raises) `|\n>>> ", text), text
        assert "line" not in text.lower()
        if synth["depth"] > 0:
            assert not re.search(rf"\b{synth['function']}\b", text), text


def test_same_seed_gives_identical_rows_and_commits_and_rows_do_not_depend_on_n(batch, tmp_path):
    out, instances = batch
    again = generate_instances(3, seed=7, out_dir=tmp_path, files="2-5", depth="0-2")
    first = (out / "instances.jsonl").read_text().splitlines()[:3]
    assert (tmp_path / "instances.jsonl").read_text().splitlines() == first
    assert [i.base_commit for i in again] == [i.base_commit for i in instances[:3]]
    other = generate_instances(1, seed=8, out_dir=tmp_path / "other", files="2-5", depth="0-2")
    assert other[0].base_commit != instances[0].base_commit or other[0].patch != instances[0].patch


def test_the_rows_of_a_seed_are_the_pinned_bytes(batch):
    out, _ = batch
    assert hashlib.sha256((out / "instances.jsonl").read_bytes()).hexdigest() == BATCH_ROWS_SHA256


def test_a_later_call_for_as_many_or_fewer_rows_reads_the_written_file(batch):
    out, instances = batch
    rows = (out / "instances.jsonl").read_text()
    assert f'"{GENERATOR_VERSION}"' in rows
    (out / "instances.jsonl").write_text(rows.replace(f'"{GENERATOR_VERSION}"', '"read back"', 1))
    try:
        again = generate_instances(3, seed=7, out_dir=out, files="2-5", depth="0-2")
        assert [i.instance_id for i in again] == [i.instance_id for i in instances[:3]]
        assert again[0].extra["version"] == "read back"
    finally:
        (out / "instances.jsonl").write_text(rows)


def test_make_tasks_gives_tasks_the_swe_env_turns_back_into_instances(batch, tmp_path):
    _, instances = batch
    tasks = make_tasks(2, 7, tmp_path, files="2-5", depth="0-2")
    assert [t.id for t in tasks] == [i.instance_id for i in instances[:2]]
    assert tasks[0].prompt == instances[0].problem_statement
    assert Path(tasks[0].metadata["repo_path"]).is_absolute()
    assert Path(tasks[0].metadata["repo_path"]).parent.parent.parent == tmp_path  # <dir>/<seed, knobs>/repos
    back = [instance_from_task(t) for t in tasks]
    assert [(b.base_commit, b.patch, b.FAIL_TO_PASS) for b in back] == [
        (i.base_commit, i.patch, i.FAIL_TO_PASS) for i in instances[:2]
    ]
    other_seed = make_tasks(1, 8, tmp_path, files="2-5", depth="0-2")  # its own directory: no collision
    assert (
        Path(other_seed[0].metadata["repo_path"]).parent.parent
        != Path(tasks[0].metadata["repo_path"]).parent.parent
    )


def test_knobs_pin_kind_and_depth(tmp_path):
    instances = generate_instances(2, seed=1, out_dir=tmp_path, files="3-5", depth=2, kinds=["swapped_args"])
    for inst in instances:
        assert inst.extra["synth"]["kind"] == "swapped_args"
        assert inst.extra["synth"]["depth"] == 2
        assert "swapped" in inst.extra["synth"]["mutation"]


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"files": 9}, "files"),
        ({"files": "3-2"}, "files"),
        ({"depth": "x"}, "depth"),
        ({"kinds": ["typo"]}, "kinds"),
    ],
)
def test_bad_knobs_are_refused_by_name(knobs, named):
    with pytest.raises(ValueError, match=rf"^{named}"):
        Knobs.of(**knobs)


def test_knobs_no_family_can_meet_are_refused_after_the_draws(tmp_path):
    with pytest.raises(
        ValueError, match=r"no instance 0 after \d+ draws with files=\(5, 5\), depth=\(5, 5\)"
    ):
        generate_instances(1, seed=0, out_dir=tmp_path, files=5, depth=5)


def test_cli_writes_instances_and_repositories(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--n", "1", "--seed", "3", "--files", "2", "--depth", "0"]) == 0
    (inst,) = load_instances(tmp_path / "instances.jsonl")
    row = json.loads((tmp_path / "instances.jsonl").read_text())
    assert row["repo_path"] == f"repos/{inst.instance_id}"
    assert (tmp_path / row["repo_path"] / ".git").is_dir()
    assert "1 instances" in capsys.readouterr().out


SOURCE = '''"""doc"""


def f(xs, n):
    """Sum of the first n."""
    total = 0
    for i in range(1, n):
        if xs[i] < 0 and n > 2:
            continue
        total += xs[i] * 2
    return g(xs[:n], "a, b")


def g(a, b):
    return [x for x in a if x]
'''


def test_each_kind_has_small_edits_that_keep_the_rest_of_the_text():
    by_kind = {kind: find_mutations(SOURCE, [kind]) for kind in KINDS}
    assert all(by_kind.values())
    for kind, mutations in by_kind.items():
        for m in mutations:
            assert m.kind == kind
            mutated = apply_mutation(SOURCE, m)
            changed = [a for a, b in zip(SOURCE.splitlines(), mutated.splitlines(), strict=False) if a != b]
            assert changed, m
            assert '"a, b"' in mutated  # untouched text keeps its quotes (no re-rendering of the module)
    described = {m.description for ms in by_kind.values() for m in ms}
    assert {
        "comparison `<` -> `<=`",
        "range stop +1",
        "operator `*` -> `//`",
        "operator `+=` -> `-=`",
    } <= described
    assert {"operator `and` -> `or`", "if branch deleted", "comprehension filter dropped"} <= described
    assert "arguments 1 and 2 of `g` swapped" in described
    drop = next(m for m in by_kind["missing_case"] if m.description == "if branch deleted")
    assert "continue" not in apply_mutation(SOURCE, drop)
    with pytest.raises(ValueError, match="unknown mutation kinds"):
        find_mutations(SOURCE, ["nope"])


def test_evaluation_compares_with_the_correct_tree_and_stops_endless_calls(tmp_path):
    bodies = {
        "good": "def f(n):\n    if n < 0:\n        raise ValueError(n)\n    return [n + 1]\n",
        "wrong": "def f(n):\n    return [n - 1]\n",
        "endless": "def f(n):\n    while True:\n        n += 1\n",
    }
    for name, body in bodies.items():
        (tmp_path / name / "p").mkdir(parents=True)
        (tmp_path / name / "p" / "__init__.py").write_text("")
        (tmp_path / name / "p" / "m.py").write_text(body)
    good, wrong, endless = evaluate(
        "p", [tmp_path / n for n in bodies], [Case("m.f", (1,)), Case("m.f", (-1,))]
    )
    assert [(o.kind, o.text, o.ok) for o in good] == [
        ("value", "[2]", True),
        ("raises", "ValueError: -1", True),
    ]
    assert [(o.kind, o.text, o.ok) for o in wrong] == [("value", "[0]", False), ("value", "[-2]", False)]
    assert [(o.kind, o.ok) for o in endless] == [("timeout", False), ("timeout", False)]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.package)
def test_each_family_module_imports_only_modules_before_it_and_every_function_has_a_drawer(family):
    names = [name for name, _ in family.modules]
    for k, (name, source) in enumerate(family.modules):
        assert source == template_source(family.package, name)
        imported = {
            node.module
            for node in ast.parse(source).body
            if isinstance(node, ast.ImportFrom) and node.module.startswith(family.package + ".")
        }
        assert imported <= {f"{family.package}.{m}" for m in names[:k]}, name
    assert set(call_graph(family.package, dict(family.modules))) == set(family.inputs)


def test_a_missing_template_is_named():
    with pytest.raises(FileNotFoundError, match=r"textkit/nope\.py\.tmpl"):
        template_source("textkit", "nope")
