"""`sao inspect RUN_DIR` shows the run's weight checks: the push probe per replica over versions and the lag-0
mismatch over steps, read from metrics.jsonl (as the run logs them) and drawn in the report's panel."""

from __future__ import annotations

import json

import pytest
import yaml

from sao.config import load_config
from sao.inspector import load_source, render_html
from sao.inspector.checks import weight_checks_view

from .test_run_report import _browser


def _run_dir(tmp_path):
    """A run directory of 4 steps on 2 replicas: replica1's push of version 3 failed; the mismatch grows."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(None, ["model.tiny_arch=qwen3_moe", "runtime.push_check.threshold=0.25"])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_yaml_dict()))
    lines = [{"step": 0, "value_pretrain/steps": 2.0}]
    for step in range(1, 5):
        bad = step == 3
        lines.append({
            "step": step, "policy/version": float(step), "reward/mean": 0.5,
            "weight_sync/probe_mean_abs_diff/replica0": 0.01, "weight_sync/probe_max_abs_diff/replica0": 0.05,
            "weight_sync/probe_mean_abs_diff/replica1": 1.5 if bad else 0.02,
            "weight_sync/probe_max_abs_diff/replica1": 4.0 if bad else 0.06,
            "mismatch/lag0_tokens": 40.0, "mismatch/lag0_logprob_abs_diff": 0.01 * step,
            "mismatch/lag0_k3_kl": 1e-4 * step, **({"mismatch/drift_ratio": 3.5} if step == 4 else {}),
        })  # fmt: skip
    lines.append({"step": 4, "eval/pass@1": 0.25})  # a second record of a step adds to it
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    return run


def test_the_view_holds_each_replicas_probe_by_version_and_the_mismatch_by_step(tmp_path):
    view = weight_checks_view(_run_dir(tmp_path))
    assert view["replicas"] == ["replica0", "replica1"]
    assert [(p["step"], p["version"]) for p in view["probe"]] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    assert view["probe"][2]["mean"] == {"replica0": 0.01, "replica1": 1.5}
    assert view["probe"][2]["max"]["replica1"] == 4.0
    assert [m["abs_diff"] for m in view["mismatch"]] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert view["mismatch"][-1]["drift_ratio"] == 3.5 and view["mismatch"][0]["k3"] == 1e-4
    assert view["push_check"]["threshold"] == 0.25 and view["mismatch_drift"]["factor"] == 2.0


def test_a_run_without_checks_or_trajectories_is_still_an_error(tmp_path):
    from sao.inspector import InspectSourceError

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.0}) + "\n")
    assert weight_checks_view(tmp_path) is None
    with pytest.raises(InspectSourceError, match=r"logging\.inspect_every"):
        load_source(tmp_path)


def test_chromium_shows_the_weight_sync_panel_with_the_failing_replica(tmp_path):
    from selenium.webdriver.common.by import By

    doc = load_source(_run_dir(tmp_path))
    assert doc["trajectories"] == [] and "weight sync checks" in doc["title"]
    report = tmp_path / "report.html"
    report.write_text(render_html(doc))
    browser, why = _browser()
    if browser is None:
        pytest.skip(why)
    try:
        browser.get(report.as_uri())
        assert browser.execute_script("return document.body.dataset.ready") == "1"
        panel = browser.find_element(By.ID, "weight-checks")
        assert panel.get_attribute("open") is not None  # opened: a push failed and the mismatch drifts
        summary = panel.find_element(By.TAG_NAME, "summary").text
        assert "4 pushes probed on 2 replica(s), 1 over the threshold" in summary and "drifting" in summary
        rows = browser.find_elements(By.CSS_SELECTOR, "#probe-table tbody tr")
        assert [r.get_attribute("data-replica") for r in rows] == ["replica0", "replica1"]
        cells = [c.text for c in rows[1].find_elements(By.TAG_NAME, "td")]
        assert cells[0] == "replica1" and cells[4] == "1.5" and cells[5] == "3" and cells[7] == "1"
        assert "check-failed" in rows[1].get_attribute("class") and not rows[0].get_attribute("class")
        lines = browser.find_elements(By.CSS_SELECTOR, "#probe-panel svg polyline")
        assert len(lines) == 2  # one line per replica, with the threshold drawn dashed
        assert browser.find_elements(By.CSS_SELECTOR, "#probe-panel svg line[stroke-dasharray]")
        mismatch = browser.find_element(By.ID, "mismatch-summary").text
        assert "steps with lag-0 tokens: 4" in mismatch and "drift ratio: 3.5" in mismatch
        assert len(browser.find_elements(By.CSS_SELECTOR, "#mismatch-panel svg polyline")) == 2
    finally:
        browser.quit()
