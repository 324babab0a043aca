"""Attacks by model-written code on the default (bwrap) sandbox, through the real `run_code`, `Sandbox` and
`CodeTestsEnv`: each case asserts the attack is contained and this process is fine afterwards, and fails if
the protection it checks is taken away. conftest.py prints the tally (``sandbox adversarial: contained N/M``).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sao.envs.base import StepResult
from sao.envs.code_tests import CodeTestsEnv
from sao.envs.sandbox import Sandbox, run_code, sandbox_mode
from sao.envs.sandbox_exec import isolation_for, probe_failure
from sao.envs.tasks import load_tasks

REPO = Path(__file__).resolve().parents[2]
SMALL = {"timeout_s": 3.0, "memory_mb": 256}

if os.environ.get("SAO_SANDBOX_MODE") and isolation_for("bwrap") is None:
    pytest.skip(
        f"SAO_SANDBOX_MODE opts into a weak mode and bwrap does not work here: {probe_failure('bwrap')}",
        allow_module_level=True,
    )


@pytest.fixture(autouse=True)
def default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case uses the default mode, whatever the caller's SAO_SANDBOX_MODE."""
    monkeypatch.delenv("SAO_SANDBOX_MODE", raising=False)
    assert sandbox_mode() == "bwrap"


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A world-readable dir outside /tmp (under /var/tmp), as task files, answer keys and data sets are."""
    path = Path(tempfile.mkdtemp(prefix="sao-adversarial-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _secret_file(directory: Path, name: str) -> tuple[Path, str]:
    token = f"ANSWER-{uuid.uuid4().hex}"
    path = directory / name
    path.write_text(f"{token}\n")
    path.chmod(0o644)
    return path, token


def _processes_with(token: str) -> list[int]:
    """Live host processes whose command line contains ``token``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline and state not in ("Z", "X") and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def _try_read(paths: list[str]) -> str:
    """Python that prints each path's content, or the error reading it."""
    return (
        f"for p in {paths!r}:\n"
        "    try:\n        print(p, 'READ', open(p).read())\n"
        "    except OSError as err:\n        print(p, 'ERROR', type(err).__name__)\n"
    )


# --- network ---------------------------------------------------------------------------------------------


def test_a_loopback_listener_of_the_host_is_unreachable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('connected')\n"
            "except OSError as err:\n    print('blocked', err.errno)\n"
        )
        res = run_code(code, **SMALL)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody came in
    assert res.stdout.startswith("blocked"), res


def test_the_internet_and_dns_are_unreachable() -> None:
    code = (
        "import socket\n"
        "print(sorted(name for _, name in socket.if_nameindex()))\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n    print('connected')\n"
        "except OSError:\n    print('no route')\n"
        "try:\n    socket.getaddrinfo('example.com', 443)\n    print('resolved')\n"
        "except OSError:\n    print('no dns')\n"
    )
    res = run_code(code, **SMALL)
    assert res.stdout == "['lo']\nno route\nno dns\n", res  # only a loopback device of its own


# --- the host filesystem ---------------------------------------------------------------------------------


def test_writes_outside_the_scratch_dir_do_not_reach_the_host(host_dir: Path) -> None:
    name = f"sao_escape_{uuid.uuid4().hex}"
    with Sandbox(**SMALL) as box:
        dirs = [Path("/work"), REPO, Path("/root"), Path("/tmp"), Path("/dev/shm"), host_dir, box.root.parent]
        targets = [str(d / name) for d in dirs]
        code = (
            f"for p in {targets!r}:\n"
            "    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n"
        )
        box.write_file("main.py", code)
        res = box.run(["python", "main.py"])
        try:
            assert res.exit_code == 0, res
            assert [t for t in targets if os.path.lexists(t)] == []
        finally:
            for t in targets:
                Path(t).unlink(missing_ok=True)


def test_a_world_readable_answer_key_and_the_project_are_invisible(host_dir: Path) -> None:
    key, token = _secret_file(host_dir, "answers.txt")
    paths = [str(key), str(REPO / "pyproject.toml"), str(REPO / "src" / "sao" / "envs" / "sandbox.py")]
    code = _try_read(paths) + f"import os\nprint(sorted(os.listdir({str(REPO)!r})))\n"
    res = run_code(code, **SMALL)
    assert token not in res.stdout and "READ" not in res.stdout, res
    assert res.stdout.count("FileNotFoundError") == len(paths), res  # not even there
    listing = res.stdout.splitlines()[-1]
    assert not any(f"'{entry}'" in listing for entry in ("src", "tests", "pyproject.toml", "data")), listing


def test_the_task_file_is_invisible(host_dir: Path, tmp_path: Path) -> None:
    token = f"ANSWER-{uuid.uuid4().hex}"
    files = []
    for directory in (host_dir, tmp_path):
        path = directory / "tasks.jsonl"
        path.write_text(json.dumps({"id": "t", "prompt": "2+2?", "answer": token}) + "\n")
        path.chmod(0o644)
        files.append(str(path))
    script = f"cat {' '.join(files)}; grep -rl {token} /var /srv /mnt /home /tmp 2>/dev/null; echo end"
    res = run_code(script, language="bash", **SMALL)
    assert token not in res.stdout + res.stderr, res
    assert res.stderr.count("No such file or directory") == len(files), res


def test_hidden_tests_of_code_tests_stay_hidden_until_submit(host_dir: Path) -> None:
    token = f"SECRET{uuid.uuid4().hex}"
    hidden = (
        "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
        f"    def test_{token}(self):\n        self.assertEqual(add(2, 3), 5)\n"
    )
    row = {
        "id": "add", "prompt": "Implement add(a, b) in calc.py.", "tests": {"hidden_test_add.py": hidden},
        "files": {"calc.py": "def add(a, b):\n    raise NotImplementedError\n"},
        "test_command": "python -m unittest -q hidden_test_add",
    }  # fmt: skip
    task_file = host_dir / "code_tasks.jsonl"
    task_file.write_text(json.dumps(row) + "\n")
    task_file.chmod(0o644)
    pattern = "SECRET[0-9a-f]\\{32\\}"  # finds the token without holding it (its own cmdline is visible)
    snoop = (
        "find / \\( -path /proc -o -path /usr -o -name site-packages \\) -prune -o -name 'hidden_*' -print;"
        f" cat hidden_test_add.py {task_file}; grep -rl '{pattern}' /var /srv /mnt /home /tmp . 2>/dev/null;"
        f" cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep '{pattern}'; echo end"
    )
    calls = [
        {"name": "run", "arguments": {"command": snoop}},
        {"name": "read_file", "arguments": {"path": "hidden_test_add.py"}},
        {
            "name": "write_file",
            "arguments": {"path": "calc.py", "content": "def add(a, b):\n    return a + b\n"},
        },
    ]
    turn = "".join(f"<tool_call>{json.dumps(call)}</tool_call>" for call in calls)
    [task] = load_tasks(task_file)  # as a run reads its tasks

    async def play() -> tuple[list[dict], StepResult]:
        env = CodeTestsEnv(command_timeout_s=10.0)
        assert env.sandbox_mode == "bwrap"
        try:
            await env.reset(task)
            snooped = await env.step(turn)
            submitted = await env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
            return snooped.observation, submitted
        finally:
            await env.close()

    observation, final = asyncio.run(play())
    seen = "\n".join(str(m["content"]) for m in observation)
    assert "end" in seen and token not in seen, seen
    assert final.done and final.reward == 1.0, final.info  # the hidden tests did run at submit


def test_the_callers_environment_does_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("SAO_ADVERSARIAL_TOKEN", secret)
    code = (
        "import os\nprint(dict(os.environ))\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError:\n        pass\n"
    )
    res = run_code(code, **SMALL)
    assert res.exit_code == 0 and "HOME" in res.stdout, res
    assert secret not in res.stdout + res.stderr


def test_the_callers_processes_are_invisible_in_proc() -> None:
    me, parent = os.getpid(), os.getppid()
    assert b"pytest" in Path(f"/proc/{me}/cmdline").read_bytes()  # what the scan below must not find
    code = (
        "import os\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(pids)\n"
        "for pid in pids:\n    print(open(f'/proc/{pid}/cmdline', 'rb').read())\n"
        f"for pid in ({me}, {parent}):\n"
        "    for what in ('cmdline', 'environ'):\n"
        "        try:\n            print('HOSTPROC', open(f'/proc/{pid}/{what}', 'rb').read())\n"
        "        except OSError:\n            pass\n"
    )
    res = run_code(code, **SMALL)
    assert res.exit_code == 0, res
    visible = json.loads(res.stdout.splitlines()[0])
    assert me not in visible and parent not in visible and max(visible) < 100, (
        visible
    )  # its own pid namespace
    assert "pytest" not in res.stdout and "HOSTPROC" not in res.stdout, res.stdout


def test_symlink_and_dotdot_escapes_lead_nowhere(host_dir: Path) -> None:
    key, token = _secret_file(host_dir, "answers.txt")
    escape = "/".join([".."] * 8) + str(key)
    script = (
        f"ln -s /etc/shadow shadow; ln -s /root rootdir; ln -s {host_dir} hostdir; ln -s {key} key\n"
        f"cat shadow key hostdir/answers.txt {escape}; echo x > hostdir/evil; ls -a rootdir/; echo end\n"
    )
    with Sandbox(**SMALL) as box:
        res = box.run(script)
        assert res.stdout.rstrip().endswith("end"), res
        for link in ("shadow", "rootdir/.bashrc", "hostdir/answers.txt", "key"):
            with pytest.raises(ValueError, match="leads out"):
                box.read_file(link)
    assert token not in res.stdout + res.stderr
    assert res.stderr.count("No such file or directory") >= 5, res.stderr  # shadow, 3 keys, hostdir/evil
    root_entries = set(res.stdout.split()) - {".", "..", "end"}
    assert root_entries <= {".pyenv"}, root_entries  # at most the interpreter's own dir of /root
    assert not (host_dir / "evil").exists()


# --- resources -------------------------------------------------------------------------------------------


def test_an_infinite_loop_times_out() -> None:
    start = time.monotonic()
    res = run_code("while True:\n    pass", timeout_s=1.0, memory_mb=256)
    assert res.timed_out and res.exit_code is None and time.monotonic() - start < 3.0, res


def test_a_memory_bomb_stops_at_the_cap() -> None:
    res = run_code("x = []\nwhile True:\n    x.append(bytearray(10**7))", **SMALL)
    assert res.oom and not res.timed_out, res


def test_a_fork_flood_is_capped_and_cleaned_up() -> None:
    token = f"forkflood{uuid.uuid4().hex}"
    code = (
        "import os, sys, time\n"
        f"if len(sys.argv) < 2:\n    os.execv(sys.executable, [sys.executable, __file__, '{token}'])\n"
        "n = 0\nfor _ in range(500):\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n        n += 1\n    except OSError:\n        break\n"
        "print(n, flush=True)\ntime.sleep(30)\n"
    )
    res = run_code(code, timeout_s=2.0, memory_mb=256)
    assert res.timed_out and int(res.stdout) < 64, res  # RLIMIT_NPROC
    assert _processes_with(token) == []


def test_two_gigabytes_of_output_are_capped() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    code = "import sys\nchunk = b'x' * 2**20\nfor _ in range(2048):\n    sys.stdout.buffer.write(chunk)\n"
    res = run_code(code, timeout_s=20.0, memory_mb=256, output_limit=65536)
    assert res.truncated and len(res.stdout) <= 65536 and time.monotonic() - start < 10.0, res.status_line()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: no 2 GB held


def test_orphaned_and_daemonised_processes_die_with_the_run() -> None:
    token = f"1000.{uuid.uuid4().int % 10**12}"  # a unique sleep duration to find them by
    code = (
        "import os, sys\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.closerange(0, 3)\n"
        f"        os.execvp('sleep', ['sleep', '{token}'])\n    os._exit(0)\n"
        f"os.system('nohup sleep {token}1 >/dev/null 2>&1 &')\n"
        "print('spawned')\n"
    )
    with Sandbox(**SMALL) as box:
        box.write_file("main.py", code)
        res = box.run(["python", "main.py"])
        assert res.stdout == "spawned\n", res
        assert _processes_with(token) == []  # already before the sandbox is closed


def test_killing_the_caller_fails() -> None:
    bystander = subprocess.Popen(["sleep", "60"])  # another of the caller's processes
    me = os.getpid()
    targeted = [
        "import os\nos.kill(os.getppid(), 9)",
        f"import os\nfor pid in ({me}, {bystander.pid}, {os.getppid()}):\n"
        "    try:\n        os.kill(pid, 9)\n    except OSError as err:\n        print(err.errno)\n",
        "import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n"
        "    if b'pytest' in open(f'/proc/{p}/cmdline', 'rb').read():\n        os.kill(int(p), 9)\n",
    ]
    # Only once the targeted attacks failed: were the sandbox broken, these would hit everything of this user.
    broad = ["import os\nos.system('pkill -9 python; pkill -9 sleep; kill -9 -1')"]
    try:
        for code in targeted:
            run_code(code, **SMALL)
        assert bystander.poll() is None  # still running, and so is this process
        for code in broad:
            run_code(code, **SMALL)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_plain_code_still_runs_after_the_attacks() -> None:
    res = run_code("print(sum(range(10)))", **SMALL)
    assert (res.stdout, res.exit_code, res.mode) == ("45\n", 0, "bwrap")
