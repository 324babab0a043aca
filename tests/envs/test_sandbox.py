"""The sandbox: normal runs, the persistent scratch dir, path checks, and adversarial code (infinite loops,
fork bombs, memory and output bombs, escapes, network, killing the caller, leftover processes), each of
which must come back as a result while this test process carries on.

The adversarial tests here run in every mode that works here (forced with ``SAO_SANDBOX_MODE``) and skip,
with the reason, what a mode does not guarantee; test_sandbox_adversarial.py attacks the default mode.
Also: the default never falls back to a weaker mode, and bwrap's minimal root wherever the interpreter is.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

import sao.envs.sandbox as sandbox_module
import sao.envs.sandbox_exec as sandbox_exec
from sao.envs import EnvError, make_env
from sao.envs.math_tir import MathTIREnv
from sao.envs.sandbox import (
    MODES,
    Sandbox,
    SandboxUnavailableError,
    _isolation,
    run_code,
    sandbox_mode,
)
from sao.envs.sandbox_exec import isolation_for
from sao.envs.sandbox_result import SandboxResult

MODE = sandbox_mode()
AVAILABLE = [m for m in MODES if isolation_for(m) is not None]
REPO = Path(__file__).resolve().parents[2]
needs_bwrap = pytest.mark.skipif(MODE != "bwrap", reason=f"needs bubblewrap; this machine runs {MODE!r}")
SMALL = {"timeout_s": 2.0, "memory_mb": 256}


@pytest.fixture(params=AVAILABLE)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SAO_SANDBOX_MODE", request.param)
    return request.param


def _guarantees() -> dict[str, bool]:
    """What the current mode promises (see the sao.envs.sandbox docstring)."""
    iso = _isolation()
    pid_ns = iso.mode == "bwrap" or "--pid" in iso.unshare_flags
    return {
        "forks_limited": iso.drop_uid or os.geteuid() != 0,  # RLIMIT_NPROC is never enforced for uid 0
        "caller_safe": pid_ns or iso.drop_uid,
        "no_network": iso.mode in ("bwrap", "unshare"),
    }


def _require(what: str) -> None:
    if not _guarantees()[what]:
        pytest.skip(f"mode {_isolation().mode!r} here does not guarantee {what}")


def _processes_with(token: str) -> list[int]:
    """Live processes whose command line contains ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def _caller_still_works() -> None:
    assert subprocess.run(["true"], timeout=10).returncode == 0


# --- normal runs ------------------------------------------------------------------------------------------


def test_run_code_reports_stdout_stderr_and_exit_code() -> None:
    res = run_code("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)", **SMALL)
    assert (res.stdout, res.stderr, res.exit_code) == ("out\n", "err\n", 3)
    assert not (res.timed_out or res.oom or res.truncated)
    assert res.mode == MODE
    assert run_code("print(6 * 7)", **SMALL).exit_code == 0


def test_run_code_sees_its_files_and_imports_them() -> None:
    files = {"helper.py": "def f():\n    return 41\n", "data/blob.bin": b"\x00\x01", "data/x.txt": "hi"}
    code = (
        "import helper\nprint(helper.f() + 1, open('data/blob.bin', 'rb').read(), open('data/x.txt').read())"
    )
    res = run_code(code, files=files, **SMALL)
    assert res.stdout == "42 b'\\x00\\x01' hi\n", res.stderr


def test_run_code_runs_bash_scripts() -> None:
    res = run_code("echo $((6 * 7)); echo oops >&2; exit 4", language="bash", **SMALL)
    assert (res.stdout, res.stderr, res.exit_code) == ("42\n", "oops\n", 4)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="language"):
        run_code("print(1)", language="ruby")
    with pytest.raises(ValueError, match="timeout_s"):
        run_code("print(1)", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        run_code("print(1)", memory_mb=1)
    with pytest.raises(ValueError, match="output_limit"):
        run_code("print(1)", output_limit=0)
    with pytest.raises(ValueError, match=r"main\.py"):
        run_code("print(1)", files={"main.py": "x"})
    with pytest.raises(ValueError, match="inside the sandbox"):
        run_code("print(1)", files={"../evil.py": "x"})


def test_environment_is_scrubbed_and_home_is_the_scratch_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAO_TEST_SECRET_TOKEN", "hunter2")
    with Sandbox(**SMALL) as box:
        res = box.run("env; pwd")
    assert "hunter2" not in res.stdout
    assert f"HOME={box.root}" in res.stdout
    assert res.stdout.rstrip().endswith(str(box.root))


def test_sandbox_keeps_files_across_runs_and_takes_stdin() -> None:
    with Sandbox(files={"in.txt": "3\n"}, **SMALL) as box:
        assert box.run("cat in.txt > copy.txt; mkdir -p out; echo made > out/note").exit_code == 0
        box.write_file("sub/extra.py", "print('extra')")
        assert box.list_files() == ["copy.txt", "in.txt", "out/note", "sub/extra.py"]
        assert box.read_file("out/note") == "made\n"
        assert box.read_file("copy.txt", max_bytes=1) == "3"
        assert box.run(["python", "sub/extra.py"]).stdout == "extra\n"
        assert box.run("read x; echo got $x", stdin="hello\n").stdout == "got hello\n"
        assert box.run(["no-such-program"]).exit_code == 127


def test_paths_leaving_the_scratch_dir_are_rejected() -> None:
    with Sandbox(**SMALL) as box:
        for bad in ("../x", "/etc/passwd", "a/../../x", "", "."):
            with pytest.raises(ValueError):
                box.write_file(bad, "x")
            with pytest.raises(ValueError):
                box.read_file(bad)
        box.run("ln -s /etc/passwd leak; ln -s / rootlink; ln -s loop loop; mkfifo pipe")
        for bad in ("leak", "rootlink/etc/passwd", "loop"):
            with pytest.raises(ValueError):
                box.read_file(bad)
            with pytest.raises(ValueError):
                box.write_file(bad, "x")
        with pytest.raises(ValueError, match="regular file"):
            box.read_file("pipe")  # returns at once instead of blocking on the FIFO
        with pytest.raises(FileNotFoundError):
            box.read_file("missing.txt")
        assert box.list_files() == []  # symlinks and FIFOs are not listed


def test_close_is_idempotent_and_removes_the_scratch_dir() -> None:
    box = Sandbox(files={"a.txt": "a"}, **SMALL)
    base = box.root.parent
    assert box.root.is_dir()
    box.close()
    box.close()
    assert not base.exists()
    with pytest.raises(RuntimeError, match="closed"):
        box.run("true")


def test_concurrent_runs_in_threads_stay_apart() -> None:
    results: dict[int, SandboxResult] = {}

    def work(i: int) -> None:
        results[i] = run_code(f"import time\ntime.sleep(0.1)\nprint({i})", **SMALL)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {i: r.stdout for i, r in results.items()} == {i: f"{i}\n" for i in range(4)}


def test_as_observation_is_compact_and_says_how_the_run_ended() -> None:
    ok = SandboxResult("42\n", "", 0, False, False, False, 0.1, "bwrap")
    assert ok.as_observation() == "42"
    assert SandboxResult("", "", 0, False, False, False, 0.1, "bwrap").as_observation() == "(no output)"
    failed = SandboxResult("partial\n", "Traceback\nValueError: x\n", 1, False, False, False, 0.1, "bwrap")
    assert failed.as_observation() == "partial\n[stderr]\nTraceback\nValueError: x\n[exit code 1]"
    slow = SandboxResult("", "", None, True, False, False, 2.04, "bwrap")
    assert slow.as_observation() == "[timed out after 2.0 s]"
    long = SandboxResult("A" * 3000 + "END", "B" * 5000 + "LAST", None, False, False, True, 0.1, "bwrap")
    text = long.as_observation(max_chars=500)
    assert len(text) <= 500
    assert text.startswith("AAA") and "END" in text and "LAST" in text and "omitted" in text
    assert text.endswith("[output truncated]")
    oom = SandboxResult("", "MemoryError\n", 1, False, True, False, 0.1, "bwrap")
    assert oom.as_observation().endswith("[out of memory; exit code 1]")


def test_forcing_an_unknown_mode_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAO_SANDBOX_MODE", "docker")
    with pytest.raises(ValueError, match="SAO_SANDBOX_MODE"):
        sandbox_mode()


# --- no silent fallback to a weaker mode -----------------------------------------------------------------


@pytest.fixture
def fresh_probes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Probe the modes anew, with only ``tmp_path/bin`` (returned) and python's dir on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "env", "sh"):  # what runs need, but not bwrap or unshare
        (bin_dir / tool).symlink_to(subprocess.check_output(["which", tool], text=True).strip())
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("SAO_SANDBOX_MODE", raising=False)
    monkeypatch.setattr(sandbox_exec, "_probed", {})
    monkeypatch.setattr(sandbox_exec, "_failures", {})
    monkeypatch.setattr(sandbox_module, "_announced", set())
    return bin_dir


def test_without_bwrap_code_running_refuses_instead_of_falling_back(fresh_probes: Path) -> None:
    for attempt in (sandbox_mode, Sandbox, lambda: run_code("print(1)")):
        with pytest.raises(SandboxUnavailableError) as err:
            attempt()
        message = str(err.value)
        assert "bubblewrap is not installed" in message and "apt-get install bubblewrap" in message
        assert "SAO_SANDBOX_MODE=unshare" in message and "SAO_SANDBOX_MODE=rlimits" in message
    for build in (MathTIREnv, lambda: make_env("code_tests")):
        with pytest.raises(EnvError, match="apt-get install bubblewrap"):
            build()
    from sao.config import ConfigError
    from sao.runtime.args import EnvArgs
    from sao.runtime.build import build_env_factory

    with pytest.raises(ConfigError, match=r"runs model-written code.*apt-get install bubblewrap"):
        build_env_factory(EnvArgs("math_tir", {}))  # a run fails at start-up


def test_a_failing_bwrap_probe_is_reported_with_its_stderr(fresh_probes: Path) -> None:
    fake = fresh_probes / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailableError) as err:
        Sandbox()
    message = str(err.value)
    assert "bwrap: setting up uid map: Permission denied" in message and "user namespaces" in message
    assert "SAO_SANDBOX_MODE=rlimits" in message


def test_a_weak_mode_runs_only_when_asked_for_and_says_so(
    fresh_probes: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SAO_SANDBOX_MODE", "rlimits")
    with caplog.at_level(logging.INFO, logger="sao.envs.sandbox"):
        assert run_code("print(6 * 7)", **SMALL).stdout == "42\n"
        assert MathTIREnv().sandbox_mode == "rlimits"
    [record] = caplog.records  # once per process, not per run
    assert record.levelno == logging.WARNING and "rlimits" in record.getMessage()
    monkeypatch.setenv("SAO_SANDBOX_MODE", "unshare")
    with pytest.raises(SandboxUnavailableError, match=r"SAO_SANDBOX_MODE=unshare.*not installed"):
        sandbox_mode()  # a forced mode that cannot run is an error too


@needs_bwrap
def test_the_mode_is_logged_once_and_exposed_by_the_envs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox_module, "_announced", set())
    with caplog.at_level(logging.INFO, logger="sao.envs.sandbox"):
        run_code("print(1)", **SMALL)
        run_code("print(2)", **SMALL)
        envs = [MathTIREnv(), make_env("code_tests")]
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["sandbox mode: bwrap"]
    assert [env.sandbox_mode for env in envs] == ["bwrap", "bwrap"]


# --- adversarial code, in every mode that works here -----------------------------------------------------


def test_infinite_loop_times_out(mode: str) -> None:
    start = time.monotonic()
    res = run_code("print('started', flush=True)\nwhile True:\n    pass", timeout_s=1.0, memory_mb=256)
    assert time.monotonic() - start < 2.5
    assert res.timed_out and res.exit_code is None and res.mode == mode
    assert res.stdout == "started\n"  # output before the kill is kept
    assert "timed out" in res.as_observation()


def test_output_flood_is_truncated_quickly(mode: str) -> None:
    start = time.monotonic()
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 4096)"
    res = run_code(code, output_limit=100_000, **SMALL)
    assert time.monotonic() - start < 2.0
    assert res.truncated and not res.timed_out
    assert len(res.stdout) + len(res.stderr) <= 100_000


def test_memory_bomb_is_reported(mode: str) -> None:
    res = run_code("x = []\nwhile True:\n    x.append(bytearray(10**7))", **SMALL)
    assert res.oom and res.exit_code != 0 and not res.timed_out
    assert "out of memory" in res.as_observation()


def test_oversized_file_is_refused(mode: str) -> None:
    code = (
        "try:\n    open('big', 'wb').write(b'0' * (65 * 2**20))\nexcept OSError as err:\n    print(err.errno)"
    )
    with Sandbox(memory_mb=512, timeout_s=5.0) as box:
        box.write_file("main.py", code)
        res = box.run(["python", "main.py"])
        assert res.stdout == "27\n", res  # EFBIG: RLIMIT_FSIZE
        assert (box.root / "big").stat().st_size <= 64 * 2**20


def test_fork_bomb_is_contained(mode: str) -> None:
    _require("forks_limited")
    token = f"forkbomb{uuid.uuid4().hex}"
    code = (
        "import os, sys\n"
        f"if len(sys.argv) < 2:\n    os.execv(sys.executable, [sys.executable, __file__, '{token}'])\n"
        "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    start = time.monotonic()
    res = run_code(code, timeout_s=1.5, memory_mb=256)
    assert time.monotonic() - start < 5.0
    assert res.timed_out
    assert _processes_with(token) == []
    _caller_still_works()
    shell = run_code(":(){ :|:& };:", language="bash", timeout_s=1.5, memory_mb=256)
    assert shell.exit_code is not None or shell.timed_out
    _caller_still_works()


def test_background_processes_do_not_outlive_the_run(mode: str) -> None:
    token = f"1000.{uuid.uuid4().int % 10**12}"  # a unique sleep duration to find the processes by
    script = (
        f"nohup sleep {token} >/dev/null 2>&1 &\n(setsid sleep {token}1 &)\nsleep {token}2 &\necho spawned"
    )
    start = time.monotonic()
    res = run_code(script, language="bash", **SMALL)
    assert res.stdout == "spawned\n" and time.monotonic() - start < 2.0
    assert _processes_with(token) == []
    with Sandbox(**SMALL) as box:
        assert box.run(f"nohup sleep {token}3 > /dev/null 2>&1 &").exit_code == 0
        assert _processes_with(token) == []


def test_code_cannot_kill_the_caller(mode: str) -> None:
    _require("caller_safe")
    attacks = [
        "import os\nos.kill(os.getppid(), 9)",
        "import os\nos.killpg(os.getpgid(os.getppid()), 9)",
        "import os\nos.killpg(os.getpgid(0), 9)",
        "import os\nos.kill(-1, 9)",
        f"import os\nos.kill({os.getpid()}, 9)",
    ]
    for code in attacks:
        res = run_code(code, **SMALL)
        assert isinstance(res, SandboxResult)
    _caller_still_works()
    assert run_code("print('still fine')", **SMALL).stdout == "still fine\n"


def test_network_is_unreachable(mode: str) -> None:
    _require("no_network")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('connected')\n"
            "except OSError as err:\n    print('refused', err.errno)\n"
            "try:\n    socket.getaddrinfo('example.com', 80)\n    print('resolved')\n"
            "except OSError:\n    print('no dns')\n"
        )
        res = run_code(code, **SMALL)
    assert res.stdout.startswith("refused") and "no dns" in res.stdout, res


@needs_bwrap
def test_writes_outside_the_scratch_dir_do_not_reach_the_host() -> None:
    name = f"sao_escape_{uuid.uuid4().hex}"
    targets = [Path("/tmp") / name, REPO / name, Path.home() / name, Path("/dev/shm") / name]
    attempt = (
        "try:\n    open({!r}, 'w').write('x')\n    print('wrote')\nexcept OSError:\n    print('denied')\n"
    )
    code = "".join(attempt.format(str(t)) for t in targets)
    try:
        res = run_code(code, **SMALL)
        assert res.exit_code == 0, res
        assert [t for t in targets if t.exists()] == []
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_private_uid_cannot_write_the_callers_files(mode: str) -> None:
    if not _isolation().drop_uid or REPO.stat().st_mode & 0o002:
        pytest.skip("no private uid here (sao is not root), or the repo is world-writable")
    target = REPO / f"sao_escape_{uuid.uuid4().hex}"
    try:
        res = run_code(f"open({str(target)!r}, 'w').write('x')", **SMALL)
        assert res.exit_code == 1 and ("PermissionError" in res.stderr or "OSError" in res.stderr)
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


def test_the_interpreter_is_the_callers(mode: str) -> None:
    res = run_code("import sys\nprint(sys.executable)", **SMALL)
    assert res.stdout.strip() == sys.executable


# --- bwrap's minimal root --------------------------------------------------------------------------------


@needs_bwrap
def test_the_bwrap_root_holds_the_system_and_the_interpreter_only() -> None:
    code = (
        "import importlib.util, json, os, sqlite3, ssl, numpy\n"
        "print(json.dumps([os.listdir('/'), os.listdir('/etc'), importlib.util.find_spec('sao') is None]))\n"
    )
    res = run_code(code, **SMALL)
    assert res.exit_code == 0, res  # the standard library and installed packages import
    top, etc, no_sao = json.loads(res.stdout)
    system = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr"}
    # besides: the first dirs of the interpreter's paths and of the scratch dir, nothing of the host
    needed = {Path(p).parts[1] for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, tempfile.gettempdir())}
    assert set(top) - system <= needed, top
    assert "shadow" not in etc and "passwd" in etc
    assert no_sao  # sandboxed code does not get sao's own source


@needs_bwrap
@pytest.mark.parametrize("private_parent", [False, True], ids=["open-parent", "private-parent"])
def test_an_interpreter_under_tmp_gets_bwrap(private_parent: bool) -> None:
    """A virtualenv under /tmp (a checkout cloned there: its dirs 0755; or under a 0700 dir) still gets the
    strong mode though each run has a private /tmp, and the rest of the host's /tmp stays hidden."""
    parent = Path(tempfile.mkdtemp(prefix="sao-venv-", dir="/tmp"))
    try:
        parent.chmod(0o700 if private_parent else 0o755)
        venv = parent / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv], check=True
        )
        secret = parent / "secret.txt"
        secret.write_text("hidden")
        secret.chmod(0o644)
        inner = f"import os, sys\nprint(sys.prefix)\nprint(os.path.exists({str(secret)!r}))"
        script = (
            "from sao.envs.sandbox import run_code, sandbox_mode\n"
            f"print(sandbox_mode())\nres = run_code({inner!r})\nprint(res.stdout + res.stderr)\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "SAO_SANDBOX_MODE"}
        env["PYTHONPATH"] = str(REPO / "src")  # for this process; the sandboxed one needs no sao
        python = str(venv / "bin" / "python")
        out = subprocess.run([python, "-c", script], capture_output=True, text=True, env=env, timeout=60)
        assert out.stdout.split() == ["bwrap", str(venv), "False"], out
    finally:
        shutil.rmtree(parent, ignore_errors=True)
