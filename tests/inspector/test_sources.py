"""What `sao inspect` opens besides a run: trajectory JSONL files and evaluation reports with transcripts,
and the clear errors for anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sao.inspector import InspectSourceError, load_source, render_html
from sao.types import Trajectory, save_jsonl

AIME = str(Path(__file__).resolve().parents[2] / "data" / "aime_style_sample.jsonl")


def _traj(i: int, reward: float = 1.0) -> Trajectory:
    return Trajectory(
        prompt_id=f"p{i}", token_ids=[10, 11, 12, 13, 14, 15, 16], action_mask=[0, 0, 1, 1, 0, 1, 1],
        rollout_logprobs=[0.0, 0.0, -0.5, -0.25, 0.0, -1.0, -2.0], versions=[-1, -1, 3, 3, -1, 4, 4],
        turn_ids=[-1, -1, 0, 0, 0, 1, 1], rewards=[reward], metadata={"session_id": f"s{i}"},
    )  # fmt: skip


def test_a_trajectory_jsonl_opens_with_roles_turns_and_rollout_numbers(tmp_path, tiny_moe_dir):
    path = tmp_path / "sessions.jsonl"
    save_jsonl(path, [_traj(0), _traj(1, 0.0)])
    with path.open("a") as f:
        f.write('{"not": "a trajectory"}\n')
    doc = load_source(path, tokenizer=tiny_moe_dir)
    assert doc["kind"] == "trajectory" and len(doc["trajectories"]) == 2
    assert doc["skipped"] and doc["skipped"][0].startswith("line 3:")
    rec = doc["trajectories"][0]
    assert rec["session_id"] == "s0" and rec["reward"] == 1.0 and rec["turns"] == 2
    tk = rec["tokens"]
    assert tk["role"] == "ppaaoaa" and tk["turn"] == [-1, -1, 0, 0, 0, 1, 1]
    assert tk["rollout_logprob"] == [None, None, -0.5, -0.25, None, -1.0, -2.0]
    assert len(tk["text"]) == 7 and "advantage" not in tk  # no trainer fields
    assert "sessions.jsonl: 2 trajectories" in render_html(doc)


def test_token_ids_need_a_tokenizer_and_bad_files_are_named(tmp_path):
    path = tmp_path / "sessions.jsonl"
    save_jsonl(path, [_traj(0)])
    with pytest.raises(InspectSourceError, match="pass --tokenizer"):
        load_source(path)
    with pytest.raises(InspectSourceError, match="no such file"):
        load_source(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(InspectSourceError, match="empty file"):
        load_source(tmp_path / "empty.jsonl")
    (tmp_path / "junk.jsonl").write_text("not json\n")
    with pytest.raises(InspectSourceError, match=r"no readable trajectory.*line 1"):
        load_source(tmp_path / "junk.jsonl")
    (tmp_path / "other.json").write_text(json.dumps({"some": "report"}))
    with pytest.raises(InspectSourceError, match="neither trajectories"):
        load_source(tmp_path / "other.json")
    with pytest.raises(InspectSourceError, match=r"--step applies to a run directory"):
        load_source(path, step=3)
    with pytest.raises(InspectSourceError, match=r"logging\.inspect_every"):
        load_source(tmp_path)  # a directory without kept trajectories


def test_an_evaluation_report_with_transcripts_opens_in_the_same_view(tmp_path, tiny_moe_dir):
    from sao.cli import app

    report = tmp_path / "eval.json"
    args = ["eval", "--model", str(tiny_moe_dir), "--tasks", AIME, "--k", "1", "--limit", "2"]
    args += ["--max-turns", "2", "--max-tokens-per-turn", "8", "--device", "cpu", "--out", str(report)]
    args += ["--transcripts"]
    assert CliRunner().invoke(app, args).exit_code == 0
    html = tmp_path / "eval.html"
    result = CliRunner().invoke(app, ["inspect", str(report), "--out", str(html)])
    assert result.exit_code == 0, result.output
    assert "2 trajectories" in result.output and html.stat().st_size > 0
    doc = load_source(report)  # the tokenizer: the report's settings.model
    assert doc["kind"] == "eval" and [r["task"] for r in doc["trajectories"]] == [
        "aime-style-1",
        "aime-style-2",
    ]
    sample = json.loads(report.read_text())["tasks"][0]["samples"][0]
    rec = doc["trajectories"][0]
    assert rec["tokens"]["id"] == sample["trajectory"]["token_ids"] and rec["reward"] == sample["reward"]
    assert "a" in rec["tokens"]["role"] and len(rec["tokens"]["text"]) == len(
        sample["trajectory"]["token_ids"]
    )

    plain = json.loads(report.read_text())  # a report written without --transcripts has no tokens
    for task in plain["tasks"]:
        for s in task["samples"]:
            s.pop("trajectory")
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "plain.json")])
    assert result.exit_code == 2 and "rerun with --transcripts" in result.output
