"""The local runtime's thread plan (sao.runtime.threads): half the cores per side by default, a number
where configured, torch's own setting under OMP_NUM_THREADS, and the trainer's thread really set."""

from __future__ import annotations

import threading

import pytest
import torch

from sao.runtime.threads import ThreadPlan, available_cores, plan_threads, trainer_executor


@pytest.mark.parametrize(("cores", "each"), [(1, 1), (2, 1), (3, 1), (8, 4), (64, 32)])
def test_the_default_gives_each_side_half_the_cores(cores, each):
    assert plan_threads("local", None, None, cores=cores, environ={}) == ThreadPlan(each, each, cores)
    assert plan_threads("process", None, None, cores=cores, environ={}) == ThreadPlan(each, each, cores)


def test_configured_counts_win_and_a_server_engine_gets_none():
    assert plan_threads("local", 3, None, cores=8, environ={}) == ThreadPlan(3, 4, 8)
    assert plan_threads("process", None, 6, cores=8, environ={}) == ThreadPlan(4, 6, 8)
    assert plan_threads("vllm", None, None, cores=8, environ={}) == ThreadPlan(None, 4, 8)


def test_omp_num_threads_keeps_torch_setting_for_the_sides_left_unset():
    plan = plan_threads("local", None, 2, cores=8, environ={"OMP_NUM_THREADS": "1"})
    assert plan == ThreadPlan(None, 2, 8)
    assert "engine torch default, trainer 2 (8 cores)" in plan.describe()


def test_available_cores_is_the_affinity_mask():
    assert 1 <= available_cores() <= (torch.multiprocessing.cpu_count() or 1)


def test_the_trainer_executor_sets_its_own_thread_and_leaves_the_caller_alone():
    before = torch.get_num_threads()
    target = 2 if before == 1 else 1
    pool = trainer_executor(target)
    try:
        name, seen = pool.submit(lambda: (threading.current_thread().name, torch.get_num_threads())).result()
    finally:
        pool.shutdown()
    assert name.startswith("sao-trainer") and seen == target
    assert torch.get_num_threads() == before
