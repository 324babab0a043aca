"""Peer validation: verl's published 128-GPU fully-async table, rebuilt from its stage times."""

from __future__ import annotations

import pytest

from sao.plan import peers


def test_the_published_rows_are_transcribed_consistently() -> None:
    sync = peers.PUBLISHED["colocate_sync_128"]
    assert sync.other_s == pytest.approx(10.72, abs=0.01)  # 356.30 − 177.85 − 53.92 − 113.81
    for key in ("async_s0", "async_s0.1", "async_s0.3", "async_s0.5"):
        assert 3.9 < peers.PUBLISHED[key].other_s < 4.4  # the per-sync overhead left after gen and update
    assert peers.PUBLISHED["async_s0.5"].staleness == 0.5
    assert sync.step_s / peers.PUBLISHED["async_s0.5"].step_s == pytest.approx(2.37, abs=0.01)


def test_verl_mapping_replicates_its_rollout_bounds() -> None:
    engine = peers.ENGINE_SHAPE
    _, layout, policy = peers.verl_case(peers.PUBLISHED["async_s0.5"], engine, mean_tokens=1000.0)
    assert (layout.engine_replicas, layout.trainer_workers) == (16, 64)  # 64 rollout GPUs at TP 4
    assert policy.capacity == int(128 * 1.5 * 4) * 16  # verl's max_required_samples × rollout.n
    assert policy.max_in_flight == 16 * 16 * 16  # 16 prompts per server × 16 servers × n
    assert policy.free_on_push and policy.push_every == 4 and policy.batch_size == 2048
    _, layout, policy = peers.verl_case(peers.PUBLISHED["colocate_sync_128"], engine, mean_tokens=1000.0)
    assert layout.colocated and layout.engine_replicas == 32 and policy.batch_size == 8192


@pytest.mark.slow  # ~18 s of simulation on 2 cores; `make test-slow` runs it (make test stays under ~12 min)
def test_predicted_speedup_is_within_15_percent_of_the_published_2_35x() -> None:
    prediction = peers.predict(lam=peers.FITTED_LAMBDA, sync_steps=21)
    # The sync step reproduces the published one (λ was fitted on its generation time) ...
    assert prediction.step_s("colocate_sync_128") == pytest.approx(356.30, rel=0.05)
    # ... and the async step and the speed-up are predictions.
    assert prediction.speedup() == pytest.approx(peers.PUBLISHED_SPEEDUP, rel=0.15)
    assert prediction.step_s("async_s0.5") == pytest.approx(150.63, rel=0.15)
    result = prediction.rows["async_s0.5"]
    assert result.admission.max <= 5  # the capacity: 768 prompts = 6 updates of 128 ahead of the trainer
    assert result.lag.max > 1 and 0 < result.trainer_utilisation < 1


def test_the_profile_is_the_derived_verl_constants() -> None:
    costs = peers.profile_costs(peers.PROFILE)
    assert "verl" in costs.source and costs.trainer.workers == 64
    assert costs.engine.t0_s == pytest.approx(peers.ENGINE_SHAPE.t0_s * peers.FITTED_LAMBDA)
    with pytest.raises(ValueError, match="unknown profile"):
        peers.profile_costs("nope")


def test_the_baked_engine_speed_is_what_the_fit_finds() -> None:
    # FITTED_LAMBDA averages 200 barriers; 20 land within their noise (the longest response sets each).
    lam = peers.solve_lambda(peers.FITTED["median"], peers.FITTED["sigma"], barriers=20)
    assert lam == pytest.approx(peers.FITTED_LAMBDA, rel=0.1)
