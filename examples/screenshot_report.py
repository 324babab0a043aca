"""Screenshot a `sao inspect` report in headless Chromium (the figure of docs/inspect.md).

    python examples/screenshot_report.py runs/quickstart/rl/inspect.html docs/inspect_quickstart.png \
        --step 70 --colour advantage

Opens the report, picks the kept trajectory of ``--step`` with the most turns (ties: the highest reward),
colours its tokens by ``--colour``, clicks the first action token of its last turn (the panel shows every
number of that token) and saves a ``--width`` × ``--height`` PNG. Needs chromium, chromedriver and
selenium (`make install` sets them up where it can).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report")
    ap.add_argument("out")
    ap.add_argument("--step", type=int, default=None, help="Kept step to show (default: every step).")
    ap.add_argument("--colour", default="advantage")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=900)
    args = ap.parse_args()
    binary = next(b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b))
    options = Options()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        f"--window-size={args.width},{args.height}",
    ):
        options.add_argument(arg)
    options.binary_location = shutil.which(binary)
    browser = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        browser.get(Path(args.report).resolve().as_uri())
        pick = browser.execute_script(
            """const t = JSON.parse(document.getElementById('sao-data').textContent).trajectories;
            let best = -1;
            t.forEach((x, i) => { if (arguments[0] !== null && x.step !== arguments[0]) return;
              const b = t[best];
              if (best < 0 || x.turns > b.turns || (x.turns === b.turns && x.reward > b.reward)) best = i; });
            return best;""",
            args.step,
        )
        if pick < 0:
            raise SystemExit(f"no kept trajectory at step {args.step}")
        if args.step is not None:
            Select(browser.find_element(By.ID, "f-step")).select_by_value(str(args.step))
        browser.find_element(By.CSS_SELECTOR, f'tr.traj-row[data-index="{pick}"]').click()
        Select(browser.find_element(By.ID, "colour-by")).select_by_value(args.colour)
        segments = browser.find_elements(By.CSS_SELECTOR, "#conversation .segment.action")
        token = segments[-1].find_element(By.CSS_SELECTOR, ".tok")
        token.click()  # pins its numbers in the panel
        ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()
        browser.save_screenshot(args.out)
        print(f"trajectory #{pick} -> {args.out}")
    finally:
        browser.quit()


if __name__ == "__main__":
    main()
