"""Grading SWE-style instances (`sao.envs.swe_grading`): pytest report parsing, the paths a patch touches,
and the hidden tests run on a sandboxed workspace built from a tiny hand-made repository."""

from __future__ import annotations

import pytest

from sao.envs.sandbox import Sandbox
from sao.envs.swe_grading import GradeResult, grade, init_repo, parse_pytest_log, patch_paths
from sao.envs.swe_instance import SWEInstance, repo_files

from .swe_fixture import F2P, FIXED, P2P, make_instance


@pytest.fixture(scope="module")
def inst(tmp_path_factory: pytest.TempPathFactory) -> SWEInstance:
    return make_instance(tmp_path_factory.mktemp("swe"))


@pytest.fixture
def workspace(inst: SWEInstance):
    """A sandbox holding the instance's repository at its base commit, and that commit's hash."""
    with Sandbox(repo_files(inst), timeout_s=30.0, memory_mb=1024) as box:
        yield box, init_repo(box)


# --- parse_pytest_log -------------------------------------------------------------------------------

RA_REPORT = """\
============================= test session starts ==============================
collected 6 items

tests/test_a.py .F.sx                                                    [100%]

=================================== FAILURES ===================================
___________________________________ test_two ___________________________________
E   assert 1 == 2
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::test_param[a - b]
FAILED tests/test_a.py::test_two - assert 1 == 2
SKIPPED [1] tests/test_a.py:20: not on this platform
XFAIL tests/test_a.py::test_known - reason: bug 12
ERROR tests/test_b.py::test_fixture - RuntimeError: boom
PASSED tests/test_b.py::test_teardown
ERROR tests/test_b.py::test_teardown - OSError: teardown failed
==================== 1 failed, 3 passed, 1 skipped, 1 xfailed, 2 errors in 0.12s ====
"""


def test_parse_reads_the_short_summary_with_worst_status_and_parametrized_ids() -> None:
    assert parse_pytest_log(RA_REPORT) == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_a.py::test_param[a - b]": "PASSED",  # " - " inside the brackets is part of the id
        "tests/test_a.py::test_two": "FAILED",
        "tests/test_a.py::test_known": "XFAIL",
        "tests/test_b.py::test_fixture": "ERROR",
        "tests/test_b.py::test_teardown": "ERROR",  # passed, then failed at teardown: the worst wins
    }


def test_parse_reads_verbose_lines_and_ignores_colour_codes() -> None:
    log = (
        "tests/test_a.py::test_one PASSED                                         [ 33%]\n"
        "\x1b[31mtests/test_a.py::test_two FAILED\x1b[0m                          [ 66%]\n"
        "tests/test_a.py::TestK::test_m[1-2] XPASS\n"
        "some text PASSED without a node id\n"
    )
    assert parse_pytest_log(log) == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
        "tests/test_a.py::TestK::test_m[1-2]": "XPASS",
    }


def test_parse_of_text_without_a_report_is_empty() -> None:
    assert parse_pytest_log("Traceback (most recent call last):\nImportError: no module\n") == {}


# --- patch_paths ------------------------------------------------------------------------------------


def test_patch_paths_lists_modified_new_deleted_and_renamed_files() -> None:
    patch = (
        "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+c\n"
        "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n"
        "diff --git a/old name.py b/new name.py\nsimilarity index 100%\n"
        "rename from old name.py\nrename to new name.py\n"
        'diff --git "a/t\\303\\251st.py" "b/t\\303\\251st.py"\n'
        '--- "a/t\\303\\251st.py"\n+++ "b/t\\303\\251st.py"\n'
    )
    assert patch_paths(patch) == ["src/x.py", "new.py", "gone.py", "old name.py", "new name.py", "tést.py"]


def test_patch_paths_of_the_fixture_test_patch(inst: SWEInstance) -> None:
    assert patch_paths(inst.test_patch) == ["tests/test_new.py", "tests/test_ops.py"]
    assert patch_paths(inst.patch) == ["calc/ops.py"]


# --- grade ------------------------------------------------------------------------------------------


def test_hidden_tests_fail_at_base_and_pass_with_the_reference_patch(inst: SWEInstance, workspace) -> None:
    box, base = workspace
    before = grade(box, inst, base, timeout_s=60.0)
    assert not before.resolved and before.error is None
    assert before.fail_to_pass == {F2P[0]: "FAILED", F2P[1]: "FAILED"}
    assert before.pass_to_pass == {P2P[0]: "PASSED"}
    assert before.counts() == {
        "fail_to_pass_passed": 0,
        "fail_to_pass_failed": 2,
        "pass_to_pass_passed": 1,
        "pass_to_pass_failed": 0,
    }
    mtime = box.run("stat -c %Y calc/ops.py").stdout.strip()
    box.run(
        "python -m pytest -q -p no:cacheprovider tests/test_ops.py"
    )  # the model's own run caches bytecode
    applied = box.run("git apply -", stdin=inst.patch)
    assert applied.exit_code == 0, applied.as_observation()
    # the fix has the same length; with the same mtime second Python would trust the old cached bytecode
    box.run(f"touch -d @{mtime} calc/ops.py")
    after = grade(box, inst, base, timeout_s=60.0)  # grading twice re-applies the test patch cleanly
    assert after.resolved and after.error is None, after.output
    assert set(after.fail_to_pass.values()) == {"PASSED"} and "3 passed" in after.output


def test_the_models_edits_of_hidden_test_files_are_reset_before_grading(inst: SWEInstance, workspace) -> None:
    box, base = workspace
    box.write_file("tests/test_new.py", "def test_add_negative():\n    pass\n")
    box.write_file("tests/test_ops.py", "def test_add():\n    pass\n\n\ndef test_mul():\n    pass\n")
    box.run("git add -A && git commit -q -m cheat")  # committing does not hide them either
    result = grade(box, inst, base, timeout_s=60.0)
    assert not result.resolved and result.fail_to_pass == {F2P[0]: "FAILED", F2P[1]: "FAILED"}


def test_breaking_a_pass_to_pass_test_is_not_resolved(inst: SWEInstance, workspace) -> None:
    box, base = workspace
    box.write_file("calc/ops.py", FIXED.replace("a * b", "a ** b"))
    result = grade(box, inst, base, timeout_s=60.0)
    assert not result.resolved
    assert set(result.fail_to_pass.values()) == {"PASSED"} and result.pass_to_pass == {P2P[0]: "FAILED"}


def test_a_test_patch_that_does_not_apply_is_an_error_not_resolved(inst: SWEInstance, workspace) -> None:
    box, base = workspace
    broken = SWEInstance(**{**inst.__dict__, "test_patch": inst.test_patch.replace("test_mul", "test_zzz")})
    result = grade(box, broken, base, timeout_s=60.0)
    assert not result.resolved and result.error and "did not apply" in result.error


def test_a_test_run_past_its_timeout_is_an_error_not_resolved(inst: SWEInstance, workspace) -> None:
    box, base = workspace
    box.run("git apply -", stdin=inst.patch)
    slow = SWEInstance(**{**inst.__dict__, "test_cmd": "sleep 100; " + inst.test_cmd})
    result = grade(box, slow, base, timeout_s=1.0)
    assert not result.resolved and result.error == "the tests timed out after 1.0 s"
    assert set(result.fail_to_pass.values()) == {"MISSING"}


def test_missing_tests_do_not_count_as_passed() -> None:
    result = GradeResult(False, {"t::a": "MISSING", "t::b": "XFAIL"}, {"t::c": "SKIPPED"})
    assert result.counts() == {
        "fail_to_pass_passed": 1,
        "fail_to_pass_failed": 1,
        "pass_to_pass_passed": 0,
        "pass_to_pass_failed": 1,
    }
