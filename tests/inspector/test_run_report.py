"""`sao inspect` on a real run: a quickstart-sized training (configs/quickstart.yaml's model size, batch,
token budgets and SAO preset, the model built from its config) keeps trajectories every step; the kept
numbers are recomputed from the stored inputs with the public algorithm functions; then headless Chromium
loads the report, and the test clicks through it.

The run differs from the quickstart in what a fresh clone lacks: no SFT warm start, so the env is
``long_tail`` (a random policy already earns partial rewards there, so advantages and updates are non-zero,
where the calculator's reward stays 0 without the warm start) and the actor's lr is 1e-3 (a random model
moves slowly at 1e-4); 3 steps, every trajectory of steps 2–3 kept. With one version of lag, 5–15 % of the
action tokens fall outside the preset's DIS band, so the report has masked tokens to show.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sao.algos import AdvantageInputs, SkipObservationGAE, dis_band_state
from sao.config import load_config
from sao.inspector.store import read_step_files
from sao.runtime.runner import train_sync_entry

ROOT = Path(__file__).resolve().parents[2]
RUN_OVERRIDES = [
    "model.path=null", "model.tiny_arch=qwen3_moe", "model.tiny_size=small",
    "data.env=long_tail", "data.max_turns=8", "data.eval_file=null", "logging.eval_every=null",
    "trainer.total_steps=3", "trainer.lr=1e-3",
    "critic.pretrain.corpus_size=16", "critic.pretrain.max_steps=3",
    "logging.inspect_every=1", "logging.inspect_samples=16", "logging.checkpoint_every=3",
]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("inspect-run") / "run"
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", [*RUN_OVERRIDES, f"logging.run_dir={run}"])
    result = train_sync_entry(cfg)
    assert result.steps == 3
    return run


@pytest.fixture(scope="module")
def report(run_dir) -> Path:
    from sao.cli import app

    out = run_dir.parent / "report.html"
    result = CliRunner().invoke(app, ["inspect", str(run_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "48 trajectories" in result.output  # 3 steps x 16
    return out


def test_the_run_keeps_every_step_and_its_numbers_are_the_trainers(run_dir):
    docs = read_step_files(run_dir)
    assert [d["step"] for d in docs] == [1, 2, 3]
    meta = docs[0]["meta"]
    assert meta["advantage"] == "skip_observation_gae" and meta["policy_loss"] == "dis"
    # the estimator as the run recorded it: every field of its type, from the file's meta
    fields = [k for k in SkipObservationGAE.model_fields if k != "type"]
    estimator = SkipObservationGAE(**{k: meta[k] for k in fields})
    assert estimator == load_config(ROOT / "configs" / "quickstart.yaml", RUN_OVERRIDES).algo.advantage
    records = [t for d in docs for t in d["trajectories"]]
    masked = 0
    for rec in records:
        tk = rec["tokens"]
        action = torch.tensor([r == "a" for r in tk["role"]])
        n = len(tk["id"])
        inputs = AdvantageInputs(
            token_rewards=torch.tensor(tk["token_reward"]), action_mask=action,
            cu_seqlens=torch.tensor([0, n], dtype=torch.int32),
            values=torch.tensor([0.0 if v is None else v for v in tk["value_after"]]),
            truncated=torch.tensor([rec["truncated"]]),
        )  # fmt: skip
        adv = estimator.advantages(inputs).advantages
        assert tk["advantage"] == pytest.approx(adv.tolist(), rel=1e-4, abs=1e-5)
        zero = torch.zeros(n)
        lp = torch.tensor([0.0 if v is None else v for v in tk["logprob"]])
        ref = torch.tensor([0.0 if v is None else v for v in tk["rollout_logprob"]])
        state = torch.where(
            action, dis_band_state(lp, ref, meta["eps_low"], meta["eps_high"]), zero.to(torch.int8)
        )
        assert [0 if s is None else s for s in tk["state"]] == state.tolist()
        masked += int((state != 0).sum())
        # lag and versions as the trainer saw them
        versions = [v for v, r in zip(tk["version"], tk["role"], strict=True) if r == "a"]
        assert rec["lag_max"] == rec["trained_version"] - min(versions)
    assert masked > 0  # the report below has masked tokens to mark


def _browser():
    """A headless Chromium driven by selenium, or the reason it cannot run here."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None, "selenium is not installed (make install installs the dev extras)"
    binary = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        return None, "chromium/chromedriver not found and `make install` could not install them (no root/apt)"
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(arg)
    options.binary_location = shutil.which(binary)
    return webdriver.Chrome(options=options, service=Service(driver)), None


def test_chromium_renders_the_list_a_trajectorys_coloured_tokens_and_its_masked_tokens(report, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser, why = _browser()
    if browser is None:
        pytest.skip(why)
    try:
        browser.get(report.as_uri())
        assert browser.execute_script("return document.body.dataset.ready") == "1"
        rows = browser.find_elements(By.CSS_SELECTOR, "#traj-table tr.traj-row")
        assert len(rows) == 48
        assert browser.find_element(By.ID, "list-count").text == "48 of 48 trajectories"
        # filter by step, then sort by masked fraction (descending) and open the most masked trajectory
        Select(browser.find_element(By.ID, "f-step")).select_by_value("3")
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr.traj-row")) == 16
        Select(browser.find_element(By.ID, "f-step")).select_by_value("")
        header = browser.find_element(By.CSS_SELECTOR, 'th[data-key="masked_frac"]')
        header.click()
        browser.find_element(
            By.CSS_SELECTOR, 'th[data-key="masked_frac"]'
        ).click()  # second click: descending
        first = browser.find_element(By.CSS_SELECTOR, "tr.traj-row")
        first.click()
        assert "selected" in browser.find_element(By.CSS_SELECTOR, "tr.traj-row").get_attribute("class")
        tokens = browser.find_elements(By.CSS_SELECTOR, "#conversation .segment.action .tok")
        assert tokens, "no action tokens shown"
        colours = {t.value_of_css_property("background-color") for t in tokens}
        assert len(colours) > 3 and not colours <= {"rgba(0, 0, 0, 0)"}  # coloured by advantage
        masked = browser.find_elements(By.CSS_SELECTOR, "#conversation .tok.masked")
        assert masked, "the most masked trajectory shows no masked token"
        assert masked[0].value_of_css_property("text-decoration-line") == "line-through"
        masked[0].click()  # pins the token: every number of it in the panel
        panel = browser.find_element(By.ID, "token-panel").text
        assert "advantage" in panel and "ratio" in panel and "dropped" in panel  # its band state, named
        # colour by another quantity: the DIS ratio
        Select(browser.find_element(By.ID, "colour-by")).select_by_value("ratio")
        shown = browser.find_elements(By.CSS_SELECTOR, "#conversation .segment.action .tok")
        after = {t.value_of_css_property("background-color") for t in shown}
        assert after != colours
        # the longest episode (most turns): its observation spans are marked as the GAE skips them
        for _ in range(2):
            browser.find_element(By.CSS_SELECTOR, 'th[data-key="turns"]').click()
        browser.find_element(By.CSS_SELECTOR, "tr.traj-row").click()
        notes = browser.find_elements(By.CSS_SELECTOR, ".segment.obs .obs-note")
        assert notes and "skipped by the GAE" in notes[0].text
        assert not browser.find_elements(By.CSS_SELECTOR, ".segment.obs .tok[style*=background]")
        shot = tmp_path / "inspect.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        browser.quit()
