"""Package-level behaviour: offline Hugging Face hub by default, user override respected."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(("preset", "expected"), [(None, "1"), ("0", "0")])
def test_importing_sao_sets_hf_hub_offline_unless_the_user_did(preset, expected):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    if preset is not None:
        env["HF_HUB_OFFLINE"] = preset
    code = "import os, sao; print(os.environ['HF_HUB_OFFLINE'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected
