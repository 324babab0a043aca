"""Metric sinks: JSONL and TensorBoard round trips, fan-out, non-finite/non-scalar values, make_sinks,
and the W&B sink (with and without the package); the non-terminal progress display."""

from __future__ import annotations

import io
import json
import math
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rich.console import Console

import sao.sinks
from sao.config import ConfigError, LoggingConfig
from sao.runtime.progress import TrainingProgress, format_duration
from sao.sinks import (
    JsonlMetricsSink,
    MetricsSink,
    MultiSink,
    TensorBoardSink,
    WandbSink,
    make_sinks,
    rewind_metrics,
    scalar_value,
)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _tb_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class RecordingSink:
    def __init__(self, fail_close: bool = False) -> None:
        self.records: list[tuple[int, dict[str, Any]]] = []
        self.closed = False
        self.fail_close = fail_close

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.records.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise OSError("disk gone")


def test_jsonl_round_trip_keeps_values_and_converts_tensors(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with JsonlMetricsSink(path) as sink:
        sink.log(1, {"reward/mean": 0.25, "count": 3, "t": torch.tensor(1.5), "n": np.float32(2.0)})
        sink.log(2, {"reward/mean": -1.0})
    records = _jsonl(path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["reward/mean"] == 0.25 and records[0]["count"] == 3
    assert records[0]["t"] == 1.5 and records[0]["n"] == 2.0
    assert records[1]["reward/mean"] == -1.0 and "time" in records[1]


def test_jsonl_writes_nan_as_null_and_skips_non_scalars(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with JsonlMetricsSink(path) as sink:
        sink.log(
            0,
            {
                "nan": float("nan"),
                "inf": float("inf"),
                "ok": 1.0,
                "vec": torch.ones(3),
                "text": "hello",
                "lst": [1, 2],
                "obj": object(),
            },
        )
    line = path.read_text()
    assert "NaN" not in line and "Infinity" not in line  # strict JSON
    (record,) = _jsonl(path)
    assert record["nan"] is None and record["inf"] == 1e308 and record["ok"] == 1.0
    assert not {"vec", "text", "lst", "obj"} & record.keys()


def test_scalar_value_accepts_one_element_tensors_only() -> None:
    assert scalar_value(torch.tensor([2.5])) == 2.5
    assert scalar_value(True) == 1
    assert scalar_value(torch.zeros(2)) is None
    assert scalar_value(np.array([1.0, 2.0])) is None
    assert scalar_value("1.0") is None


def test_tensorboard_round_trip_reads_back_equal_values(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path)
    for step, value in [(1, 0.5), (2, 0.75), (3, -2.0)]:
        sink.log(step, {"reward/mean": value, "critic/grad_norm": torch.tensor(value * 2), "vec": [1, 2]})
    sink.log(4, {"reward/mean": float("nan")})
    sink.close()
    scalars = _tb_scalars(tmp_path)
    assert set(scalars) == {"reward/mean", "critic/grad_norm"}
    assert scalars["reward/mean"][:3] == [(1, 0.5), (2, 0.75), (3, -2.0)]
    assert scalars["critic/grad_norm"] == [(1, 1.0), (2, 1.5), (3, -4.0)]
    assert scalars["reward/mean"][3][0] == 4 and math.isnan(scalars["reward/mean"][3][1])


def test_multisink_fans_out_every_record_and_respects_every() -> None:
    a, b = RecordingSink(), RecordingSink()
    multi = MultiSink([a, b], every=2)
    for step in range(1, 6):
        multi.log(step, {"x": float(step)})
    assert a.records == b.records == [(2, {"x": 2.0}), (4, {"x": 4.0})]
    assert isinstance(multi, MetricsSink) and isinstance(a, MetricsSink)


def test_multisink_always_forwards_one_off_records_between_every() -> None:
    a = RecordingSink()
    multi = MultiSink([a], every=4)
    multi.log(3, {"eval/pass@1": 0.5}, always=True)
    multi.log(5, {"x": 1.0})
    assert a.records == [(3, {"eval/pass@1": 0.5})]


def test_multisink_close_closes_all_then_raises_first_error() -> None:
    a, b = RecordingSink(fail_close=True), RecordingSink()
    with pytest.raises(OSError, match="disk gone"):
        MultiSink([a, b]).close()
    assert a.closed and b.closed


def test_make_sinks_builds_jsonl_and_tensorboard_from_logging_config(tmp_path: Path) -> None:
    with make_sinks(LoggingConfig(tensorboard=True, log_every=1), tmp_path) as sinks:
        assert [type(s) for s in sinks.sinks] == [JsonlMetricsSink, TensorBoardSink]
        sinks.log(7, {"reward/mean": 0.125})
    assert _jsonl(tmp_path / "metrics.jsonl")[0]["reward/mean"] == 0.125
    assert _tb_scalars(tmp_path)["reward/mean"] == [(7, 0.125)]


def test_resumed_sinks_set_aside_the_records_after_the_checkpoint_step(tmp_path: Path) -> None:
    with make_sinks(LoggingConfig(tensorboard=True, log_every=1), tmp_path) as sinks:  # a run killed at 5
        for step in range(0, 6):
            sinks.log(step, {"reward/mean": float(step)})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "rew')  # the line the kill cut
    with make_sinks(LoggingConfig(tensorboard=True, log_every=1), tmp_path, resume_step=3) as sinks:
        for step in (4, 5):  # redone from the checkpoint of step 3
            sinks.log(step, {"reward/mean": step + 0.5})
    assert [(r["step"], r["reward/mean"]) for r in _jsonl(tmp_path / "metrics.jsonl")] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.5), (5, 5.5)
    ]  # fmt: skip
    discarded = (tmp_path / "metrics.discarded.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in discarded[:2]] == [4, 5] and discarded[2] == '{"step": 6, "rew'
    assert _tb_scalars(tmp_path)["reward/mean"] == [(s, float(s)) for s in range(4)] + [(4, 4.5), (5, 5.5)]
    assert rewind_metrics(tmp_path / "metrics.jsonl", 5) == 0  # nothing later: the file stays as it is
    assert rewind_metrics(tmp_path / "absent.jsonl", 0) == 0


def test_make_sinks_without_tensorboard_applies_log_every(tmp_path: Path) -> None:
    with make_sinks(LoggingConfig(tensorboard=False, log_every=3), tmp_path) as sinks:
        assert [type(s) for s in sinks.sinks] == [JsonlMetricsSink]
        for step in range(1, 7):
            sinks.log(step, {"x": 1.0})
    assert [r["step"] for r in _jsonl(tmp_path / "metrics.jsonl")] == [3, 6]


def test_wandb_enabled_but_missing_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match=r"logging\.wandb.*not installed"):
        make_sinks(LoggingConfig(wandb=True, tensorboard=False), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()


class FakeWandb(types.ModuleType):
    """A stand-in ``wandb`` module: records init kwargs, logged records and finishes; no network."""

    def __init__(self, with_util: bool = True) -> None:
        super().__init__("wandb")
        self.inits: list[dict[str, Any]] = []
        self.calls: list[tuple[str, Any]] = []
        self._ids = iter(f"fakeid{n:02d}" for n in range(100))
        if with_util:
            self.util = types.SimpleNamespace(generate_id=lambda: next(self._ids))

    def init(self, **kwargs: Any) -> Any:
        self.inits.append(kwargs)
        calls = self.calls

        class FakeRun:
            id = kwargs.get("id")

            def log(self, data: dict[str, Any], step: int) -> None:
                calls.append(("log", (step, data)))

            def finish(self) -> None:
                calls.append(("finish", None))

        return FakeRun()


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> FakeWandb:
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return fake


WANDB = LoggingConfig(wandb=True, tensorboard=False, log_every=1)


def test_wandb_sink_forwards_scalars_and_config_when_installed(tmp_path: Path, fake_wandb: FakeWandb) -> None:
    config = {"model": {"name": "test"}, "algo": {"lr": 1e-5}, "seed": 3}
    with make_sinks(WANDB, tmp_path / "run1", config=config) as sinks:
        assert isinstance(sinks.sinks[0], WandbSink)
        sinks.log(1, {"reward/mean": torch.tensor(0.5), "vec": torch.ones(2)})
    (init,) = fake_wandb.inits
    assert init["name"] == "run1" and init["dir"] == str(tmp_path / "run1")
    assert init["config"] == config
    assert fake_wandb.calls == [("log", (1, {"reward/mean": 0.5})), ("finish", None)]


def test_wandb_first_run_writes_its_id_and_a_resume_continues_that_run(
    tmp_path: Path, fake_wandb: FakeWandb, monkeypatch: pytest.MonkeyPatch
) -> None:
    replaced: list[tuple[str, str]] = []
    real_replace = sao.sinks.os.replace

    def recording_replace(src: Any, dst: Any) -> None:
        replaced.append((Path(src).name, Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(sao.sinks.os, "replace", recording_replace)
    run_dir = tmp_path / "run"
    with make_sinks(WANDB, run_dir) as sinks:  # the first run, killed after step 5 (checkpoint at 3)
        for step in range(6):
            sinks.log(step, {"x": float(step)})
    first = fake_wandb.inits[0]
    assert first["id"] == "fakeid00" and first.get("resume") is None
    assert (run_dir / "wandb_run_id").read_text().strip() == "fakeid00"
    assert ("wandb_run_id.tmp", "wandb_run_id") in replaced  # atomic: temp file, then os.replace
    assert not (run_dir / "wandb_run_id.tmp").exists()

    fake_wandb.calls.clear()
    with make_sinks(WANDB, run_dir, resume_step=3) as sinks:
        sinks.log(6, {"x": 6.5})
    second = fake_wandb.inits[1]
    assert second["id"] == "fakeid00" and second["resume"] == "allow"
    assert (run_dir / "wandb_run_id").read_text().strip() == "fakeid00"
    assert fake_wandb.calls == [("log", (6, {"x": 6.5})), ("finish", None)]  # the run's own step


def test_wandb_without_resume_generates_a_new_id_and_overwrites_the_file(
    tmp_path: Path, fake_wandb: FakeWandb
) -> None:
    (tmp_path / "wandb_run_id").write_text("oldrun42\n")
    make_sinks(WANDB, tmp_path).close()
    (init,) = fake_wandb.inits
    assert init["id"] == "fakeid00" and init.get("resume") is None
    assert (tmp_path / "wandb_run_id").read_text().strip() == "fakeid00"


def test_wandb_resume_without_an_id_file_starts_a_fresh_run_and_records_it(
    tmp_path: Path, fake_wandb: FakeWandb
) -> None:
    make_sinks(WANDB, tmp_path, resume_step=2).close()  # the earlier run did not log to W&B
    (init,) = fake_wandb.inits
    assert init["id"] == "fakeid00" and init.get("resume") is None
    assert (tmp_path / "wandb_run_id").read_text().strip() == "fakeid00"


def test_wandb_id_falls_back_to_uuid_without_wandb_util(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeWandb(with_util=False)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    make_sinks(WANDB, tmp_path).close()
    run_id = fake.inits[0]["id"]
    assert re.fullmatch(r"[0-9a-f]{8}", run_id)
    assert (tmp_path / "wandb_run_id").read_text().strip() == run_id


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_prints_plain_lines_with_step_reward_lag_and_eta_when_not_a_tty() -> None:
    out, clock = io.StringIO(), FakeClock()
    console = Console(file=out, width=200)
    assert not console.is_terminal
    with TrainingProgress(4, columns=["critic/explained_variance"], console=console, clock=clock) as bar:
        for step in range(1, 5):
            clock.now += 2.0
            bar.update(
                step,
                {"reward/mean": 0.25 * step, "lag/token_mean": 0.5, "critic/explained_variance": 0.1},
                trajectories=8,
            )
    lines = out.getvalue().splitlines()
    # 10 s interval, 2 s per step: the first step, then the final one only.
    assert len(lines) == 2
    assert lines[0].startswith("step 1/4 | reward 0.25 | traj/s 4 | lag 0.5 | eta 6s")
    assert "critic/explained_variance 0.1" in lines[0]
    assert lines[1].startswith("step 4/4 | reward 1 | ")
    assert "eta 0s" in lines[1]


def test_progress_prints_the_final_state_on_exit_when_it_fell_between_lines() -> None:
    out = io.StringIO()
    with TrainingProgress(10, console=Console(file=out, width=200), plain_interval_s=1e9) as bar:
        bar.update(1, {"reward/mean": 0.0})
        bar.update(3, {"reward/mean": 1.5, "vec": [1, 2]})
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["step 1/10", "step 3/10"]
    assert "reward 1.5" in lines[1]


def test_progress_live_mode_stops_rich_refresh_thread_on_exit() -> None:
    out = io.StringIO()
    bar = TrainingProgress(5, console=Console(file=out, width=120, force_terminal=True))
    with bar:
        bar.update(2, {"reward/mean": 0.5})
        live = bar._live
        assert live is not None and live.is_started
    assert bar._live is None and not live.is_started
    assert "2/5" in out.getvalue()


def test_format_duration() -> None:
    assert [format_duration(s) for s in (None, 5, 65, 3725)] == ["-", "5s", "1m05s", "1h02m05s"]
