"""Shared fixtures: run GAE tests on both implementations of the recursion.

On CPU ``sao.algos.gae`` dispatches to the compiled numba kernel when numba is importable; the blocked
tensor scan is the GPU path and the fallback. ``gae_path`` makes a test run once per path on CPU.
"""

from __future__ import annotations

import pytest

from sao.algos import gae
from sao.algos.kernels import numba_available


@pytest.fixture(params=["numba", "scan"])
def gae_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "numba":
        if not numba_available():
            pytest.skip("numba is not installed (or SAO_NUMBA=0)")
    else:
        monkeypatch.setattr(gae, "numba_available", lambda: False)
    return request.param
