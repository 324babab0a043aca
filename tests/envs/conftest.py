"""The adversarial sandbox suite's tally: each case of test_sandbox_adversarial.py that passed is an attack
contained; the end of the pytest run prints ``sandbox adversarial: contained N/M`` (skipped cases apart)."""

from __future__ import annotations

import pytest

_SUITE = "test_sandbox_adversarial.py"
_outcomes: dict[str, str] = {}  # node id: "passed" | "failed" | "skipped"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _SUITE not in report.nodeid:
        return
    if report.failed or report.skipped:
        _outcomes.setdefault(report.nodeid, report.outcome)  # a failing setup or teardown counts too
    elif report.when == "call":
        _outcomes.setdefault(report.nodeid, "passed")
    if report.failed:
        _outcomes[report.nodeid] = "failed"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _outcomes:
        return
    outcomes = list(_outcomes.values())
    ran = [o for o in outcomes if o != "skipped"]
    skipped = len(outcomes) - len(ran)
    line = f"sandbox adversarial: contained {ran.count('passed')}/{len(ran)}"
    terminalreporter.write_line(line + (f" ({skipped} skipped)" if skipped else ""))
