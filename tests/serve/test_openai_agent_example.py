"""`examples/openai_agent/agent.py` (only the openai SDK) against a real gateway: it plays sessions with
tools, closes every one with a reward (its own or the run's verifier), and its eval mode records nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sao.engine import LocalEngine
from sao.envs import make_env
from sao.envs.calculator import make_tasks
from sao.envs.tasks import save_tasks_jsonl
from sao.runtime.gateway_run import make_verifier
from sao.serve.gateway import create_app
from sao.serve.hooks import RecordingHooks

AGENT = Path(__file__).resolve().parents[2] / "examples" / "openai_agent" / "agent.py"


def test_the_example_agent_closes_every_session_and_its_eval_records_nothing(
    tiny_moe_dir, tiny_tokenizer, serve_app, tmp_path
):
    tasks = make_tasks(8, seed=3)
    save_tasks_jsonl(tmp_path / "tasks.jsonl", tasks)
    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=8)
    received = []
    verifier = make_verifier(lambda: make_env("calculator"), tasks, 5)
    app = create_app(engine, tiny_tokenizer, default_max_tokens=12, hooks=RecordingHooks(received.append),
                     verifier=verifier)  # fmt: skip
    url = serve_app(app) + "/v1"

    def agent(*args):
        cmd = [sys.executable, str(AGENT), "--base-url", url, "--tasks", str(tmp_path / "tasks.jsonl"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    own = agent("--sessions", "6", "--concurrency", "3")
    assert own.returncode == 0, own.stdout + own.stderr
    assert len(received) == 6 and all(t.metadata["env"] == "gateway" for t in received)
    assert {t.prompt_id for t in received} <= {t.id for t in tasks}  # the agent names its tasks
    verified = agent("--sessions", "4", "--reward", "verifier")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert len(received) == 10 and app.state.registry.abandoned == 0 and len(app.state.registry) == 0
    report = tmp_path / "eval.json"
    ev = agent("--eval", "--k", "1", "--out", str(report))
    assert ev.returncode == 0, ev.stdout + ev.stderr
    data = json.loads(report.read_text())
    assert data["samples"] == 8 and 0.0 <= data["pass@1"] <= 1.0
    assert len(received) == 10  # evaluation sessions are not recorded
