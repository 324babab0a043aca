"""`sao plot` and the plotting module: overlaid runs, missing metrics, smoothing, CLI exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sao.cli import app
from sao.runtime.plots import PANELS, read_metrics, smooth
from sao.sinks import JsonlMetricsSink

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


def _with_evals(run_dir: Path, evals: dict[int, dict[str, float]]) -> Path:
    """Appends eval-only records (as the run logs them: at the measured step, after later train steps)."""
    with JsonlMetricsSink(run_dir / "metrics.jsonl") as sink:
        for step, metrics in evals.items():
            sink.log(step, metrics)
    return run_dir


def _reward_ax(fig):
    return next(ax for ax in fig.axes if ax.get_title() == PANELS[0].title)


def test_the_reward_panel_draws_the_held_out_pass_at_1_next_to_the_reward(tmp_path: Path) -> None:
    from sao.runtime.plots import build_figure

    run = _run(tmp_path, "with_eval", FULL)
    _with_evals(
        run,
        {
            10: {"eval/pass@1": 0.4, "eval/pass@4": 0.6, "eval/mean_reward": 0.4, "eval/calc/pass@1": 0.4},
            0: {"eval/pass@1": 0.1, "eval/pass@4": 0.3, "eval/mean_reward": 0.1, "eval/calc/pass@1": 0.1},
            20: {"eval/pass@1": 0.7, "eval/pass@4": 0.9, "eval/mean_reward": 0.7, "eval/calc/pass@1": 0.7},
        },
    )
    fig = build_figure([run], window=5)
    ax = _reward_ax(fig)
    held_out = [line for line in ax.lines if line.get_label() == "held-out Pass@1"]
    assert len(held_out) == 1 and len(ax.lines) == 2  # the reward curve and the held-out curve
    assert list(held_out[0].get_xdata()) == [0.0, 10.0, 20.0]  # sorted by step, not smoothed
    assert list(held_out[0].get_ydata()) == [0.1, 0.4, 0.7]
    assert held_out[0].get_marker() == "o"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["reward/mean", "held-out Pass@1"]  # one file: no per-file curve
    assert all(texts == [] for texts in _panel_texts(fig).values())  # eval-only records break nothing
    other = next(ax for ax in fig.axes if ax.get_title() == "critic grad norm")
    assert len(other.lines) == 1 and len(other.lines[0].get_xdata()) == 20


def test_per_file_held_out_curves_when_the_run_evaluates_several_files(tmp_path: Path) -> None:
    from sao.runtime.plots import build_figure, plot_runs

    run = _run(tmp_path, "two_files", FULL, steps=6)
    _with_evals(
        run,
        {
            s: {"eval/pass@1": 0.5, "eval/aime/pass@1": 0.2, "eval/code/pass@1": 0.8, "eval/aime/pass@4": 0.3}
            for s in (0, 3, 6)
        },
    )
    other = _run(tmp_path, "no_eval", FULL, steps=6)
    ax = _reward_ax(build_figure([run, other]))
    labels = sorted(line.get_label() for line in ax.lines if not line.get_label().startswith("_"))
    assert labels == ["held-out Pass@1", "held-out Pass@1 (aime)", "held-out Pass@1 (code)"]
    assert len(ax.lines) == 5  # two reward curves, three held-out ones
    assert plot_runs([run, other], tmp_path / "evals.png").read_bytes().startswith(PNG_MAGIC)


def test_a_run_with_evaluations_only_draws_them_and_no_other_panel_breaks(tmp_path: Path) -> None:
    from sao.runtime.plots import build_figure

    run = _with_evals(tmp_path / "eval_only", {0: {"eval/pass@1": 0.25}, 5: {"eval/pass@1": 0.5}})
    fig = build_figure([run])
    texts = _panel_texts(fig)
    assert texts[PANELS[0].title] == []  # drawn, not "no data"
    assert [line.get_label() for line in _reward_ax(fig).lines] == ["held-out Pass@1"]
    assert texts["critic grad norm"] == ["no data"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["eval_only"]
