"""Which GPU each pytest-xdist worker uses (oracle/engine/devices.py): the logic, testable without GPUs."""

from __future__ import annotations

import pytest

from oracle.engine.devices import gpu_for_worker, worker_index


@pytest.mark.parametrize("worker_id, index", [("gw0", 0), ("gw7", 7), ("gw12", 12), ("master", None), ("", None),
                                               ("gwx", None)])
def test_worker_index(worker_id, index):
    assert worker_index(worker_id) == index


def test_worker_index_reads_xdist_environment(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert worker_index() == 3
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert worker_index() is None


def test_every_gpu_gets_a_worker_and_no_two_first_round_workers_share_one():
    for gpus in (1, 2, 4, 8):
        for workers in (gpus, 2 * gpus + 1, 16):
            assigned = [gpu_for_worker(w, gpus) for w in range(workers)]
            assert set(assigned) == set(range(min(gpus, workers)))
            assert len(set(assigned[:gpus])) == min(gpus, workers)


def test_no_gpus_means_no_gpu_and_no_worker_means_the_first():
    assert gpu_for_worker(3, 0) is None
    assert gpu_for_worker(None, 4) == 0
