"""`sao plot` and the plotting module: overlaid runs, missing metrics, smoothing, CLI exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sao.cli import app
from sao.sinks import JsonlMetricsSink
from sao.runtime.plots import PANELS, read_metrics, smooth

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()

FULL = {
    "reward/mean": lambda s: 0.1 * s,
    "critic/explained_variance": lambda s: 1 - 1 / (s + 1),
    "critic/grad_norm": lambda s: 2.0 / (s + 1),
    "dis/masked_frac": lambda s: 0.05,
    "lag/token_mean": lambda s: 0.5 + 0.01 * s,
    "throughput/trajectories_per_s": lambda s: 3.0,
}


def _run(root: Path, name: str, metrics: dict, steps: int = 20) -> Path:
    run_dir = root / name
    with JsonlMetricsSink(run_dir / "metrics.jsonl") as sink:
        for step in range(1, steps + 1):
            sink.log(step, {k: f(step) for k, f in metrics.items()})
    return run_dir


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    partial = {k: FULL[k] for k in ("reward/mean",)} | {"throughput/tokens_per_s": lambda s: 900.0}
    return _run(tmp_path, "sao_full", FULL), _run(tmp_path, "grpo_partial", partial)


def test_read_metrics_skips_nulls_and_torn_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"step": 1, "time": 0.0, "reward/mean": 0.5, "dis/masked_frac": None}),
                json.dumps({"step": 2, "time": 1.0, "reward/mean": 0.75, "flag": True}),
                '{"step": 3, "reward/me',  # a live run's half-written line
            ]
        )
    )
    assert read_metrics(path) == {"reward/mean": ([1.0, 2.0], [0.5, 0.75])}


def test_smooth_mean_and_ema() -> None:
    assert smooth([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert smooth([1.0, 2.0], 1) == [1.0, 2.0]
    assert smooth([0.0, 3.0], 2, "ema") == [0.0, 2.0]  # alpha = 2/3
    with pytest.raises(ValueError, match="smoothing kind"):
        smooth([1.0, 2.0], 2, "median")  # type: ignore[arg-type]


def test_metric_names_are_documented_in_module_docstring() -> None:
    import sao.runtime.plots as plots

    for panel in PANELS:
        for name in panel.metrics:
            assert f"``{name}``" in (plots.__doc__ or "")


def test_plot_two_runs_writes_png_even_when_one_misses_metrics(
    two_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    from sao.runtime.plots import plot_runs

    out = plot_runs(two_runs, tmp_path / "cmp" / "out.png", window=3, kind="ema")
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000


def _panel_texts(fig) -> dict[str, list[str]]:
    return {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes if ax.get_title()}


def test_panels_without_data_say_no_data_and_the_others_draw_every_run(two_runs: tuple[Path, Path]) -> None:
    from sao.runtime.plots import build_figure

    fig = build_figure(two_runs)
    texts = _panel_texts(fig)
    assert len(texts) == len(PANELS) and all(texts[p.title] == [] for p in PANELS)
    reward_ax = next(ax for ax in fig.axes if ax.get_title() == PANELS[0].title)
    assert len(reward_ax.lines) == 2  # both runs overlaid
    partial_only = build_figure(two_runs[1:])
    assert _panel_texts(partial_only)["critic grad norm"] == ["no data"]
    assert _panel_texts(partial_only)[PANELS[0].title] == []


def test_throughput_prefers_the_metric_all_runs_share(tmp_path: Path) -> None:
    from sao.runtime.plots import build_figure

    both = {"throughput/trajectories_per_s": lambda s: 3.0, "throughput/tokens_per_s": lambda s: 900.0}
    runs = [
        _run(tmp_path, "a", both, 3),
        _run(tmp_path, "b", {"throughput/tokens_per_s": lambda s: 800.0}, 3),
    ]
    ax = next(ax for ax in build_figure(runs).axes if ax.get_title() == "throughput")
    assert ax.get_ylabel() == "throughput/tokens_per_s"
    assert sorted(line.get_ydata()[0] for line in ax.lines) == [800.0, 900.0]


def test_plot_with_no_known_metrics_still_writes_a_png(tmp_path: Path) -> None:
    from sao.runtime.plots import plot_runs

    run = _run(tmp_path, "empty", {"other/x": lambda s: 1.0}, steps=3)
    assert plot_runs([run], tmp_path / "empty.png").read_bytes().startswith(PNG_MAGIC)


def test_cli_plot_writes_the_file_and_exits_zero(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "comparison.png"
    result = runner.invoke(app, ["plot", *map(str, two_runs), "--out", str(out), "--smooth", "5"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert str(out) in result.output


def test_cli_plot_defaults_to_metrics_png_in_the_first_run_dir(two_runs: tuple[Path, Path]) -> None:
    result = runner.invoke(app, ["plot", str(two_runs[0])])
    assert result.exit_code == 0, result.output
    assert (two_runs[0] / "metrics.png").is_file()


def test_cli_plot_missing_run_dir_exits_2_naming_it(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    missing = tmp_path / "no_such_run"
    result = runner.invoke(app, ["plot", str(two_runs[0]), str(missing), "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "no_such_run" in result.output and "does not exist" in result.output
    assert not (tmp_path / "x.png").exists()


def test_cli_plot_run_dir_without_metrics_exits_2(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    result = runner.invoke(app, ["plot", str(tmp_path / "bare")])
    assert result.exit_code == 2
    assert "no metrics.jsonl" in result.output
