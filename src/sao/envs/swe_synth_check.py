"""Running generated code for `sao.envs.swe_synth`: calling package functions on drawn arguments, and
running a package's pytest suite.

Both run in a fresh interpreter (``python -I -B``) so that neither the generator's process nor its
imports are touched by the code under test; a tree's package is forgotten before the next tree is run.
`evaluate` tells which cases a mutation breaks (the correct tree first, the mutated ones after);
`run_pytest` confirms that the rendered tests fail and pass where they should.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TIMEOUT_PER_CALL_S", "Case", "Outcome", "evaluate", "run_pytest"]

TIMEOUT_PER_CALL_S = 0.5


@dataclass(frozen=True)
class Case:
    """One call of a package function: ``function`` is ``"module.name"``, ``args`` a literal tuple."""

    function: str
    args: tuple[Any, ...]

    @property
    def name(self) -> str:
        return self.function.split(".")[1]

    @property
    def call(self) -> str:
        return f"{self.name}({', '.join(repr(a) for a in self.args)})"


@dataclass(frozen=True)
class Outcome:
    """What a call did: ``kind`` "value" / "raises" / "timeout"; ``text`` the value's repr or
    ``"Error: message"``; ``exc`` the exception's type name; ``ok``: agrees with the correct code;
    ``literal``: a test can write the outcome down (a value that ``repr`` round-trips, a builtin error)."""

    kind: str
    text: str
    exc: str = ""
    ok: bool = True
    literal: bool = True


_EVALUATOR = r"""
import ast, builtins, importlib, json, resource, signal, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
class Timeout(BaseException):
    pass
def alarm(*_):
    raise Timeout()
signal.signal(signal.SIGVTALRM, alarm)  # CPU time: a busy machine does not time a call out
job = json.load(sys.stdin)
package = job["package"]
reference, report = None, []
for v, root in enumerate(job["variants"]):
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
    sys.path.insert(0, root)
    importlib.invalidate_caches()
    got = []
    for module, func, args in job["cases"]:
        signal.setitimer(signal.ITIMER_VIRTUAL, job["timeout"])
        try:
            function = getattr(importlib.import_module(package + "." + module), func)
            got.append(("value", function(*ast.literal_eval(args))))
        except Timeout:
            got.append(("timeout", None))
        except Exception as err:
            got.append(("raises", err))
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    sys.path.pop(0)
    reference = reference or got
    rows = []
    for (kind, value), (ref_kind, ref) in zip(got, reference):
        try:
            same_error = kind == "timeout" or isinstance(value, type(ref))
            ok = kind == ref_kind and (value == ref if kind == "value" else same_error)
            literal = kind != "value" or (ast.literal_eval(repr(value)) == value)
        except Exception:
            ok = literal = False
        exc = type(value).__name__ if kind == "raises" else ""
        text = repr(value) if kind == "value" else f"{exc}: {value}" if kind == "raises" else ""
        literal = literal and (kind != "raises" or getattr(builtins, exc, None) is type(value))
        rows.append([kind, text if v == 0 else text[:300], exc, bool(ok), bool(literal)])
    report.append(rows)
print(json.dumps(report))
"""


def evaluate(package: str, roots: Sequence[Path], cases: Sequence[Case]) -> list[list[Outcome]]:
    """Run every case on each package tree in ``roots`` (the first holds the correct code) in one
    subprocess (1 GiB address space, `TIMEOUT_PER_CALL_S` of CPU time per call); ``[tree][case]``
    outcomes, ``ok`` comparing each with the first tree's (``==`` on values, the same exception type on
    errors)."""
    job = {
        "package": package,
        "variants": [str(r) for r in roots],
        "cases": [[c.function.split(".")[0], c.name, repr(c.args)] for c in cases],
        "timeout": TIMEOUT_PER_CALL_S,
    }
    proc = subprocess.run(
        [sys.executable, "-I", "-B", "-c", _EVALUATOR],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the case evaluator failed: {proc.stderr[-2000:]}")
    return [[Outcome(*row) for row in tree] for tree in json.loads(proc.stdout)]


_PYTEST_DRIVER = r"""
import json, os, sys
import pytest
package, out, roots = sys.argv[1], sys.argv[2], sys.argv[3:]
class Log:
    def __init__(self):
        self.status = {}
    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.status[report.nodeid] = "ERROR" if report.when != "call" else "FAILED"
        elif report.when == "call":
            self.status.setdefault(report.nodeid, "PASSED")
results = []
for root in roots:
    for name in [m for m in sys.modules if m.split(".")[0] == package or m.startswith("test_")]:
        del sys.modules[name]
    os.chdir(root)
    sys.path.insert(0, root)
    log = Log()
    pytest.main(["-q", "-p", "no:cacheprovider", "tests"], plugins=[log])
    sys.path.remove(root)
    results.append(log.status)
with open(out, "w") as f:
    json.dump(results, f)
"""


def run_pytest(package: str, roots: Sequence[Path]) -> list[dict[str, str]]:
    """``{node id: "PASSED" | "FAILED" | "ERROR"}`` for the tests of each tree in ``roots``: pytest runs
    each in turn in one fresh interpreter (plugins not autoloaded), the package's modules and the test
    modules forgotten between trees."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    with tempfile.TemporaryDirectory(prefix="sao-swe-pytest-") as tmp:
        out = Path(tmp) / "results.json"
        cmd = [sys.executable, "-I", "-B", "-c", _PYTEST_DRIVER, package, str(out), *map(str, roots)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
        if not out.is_file():
            raise RuntimeError(f"the pytest driver failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return json.loads(out.read_text())
