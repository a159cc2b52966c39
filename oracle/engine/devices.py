"""Which device a process runs cases on: the GPU a pytest-xdist worker owns, or the CPU interpreter.

With several GPUs, worker gwN takes GPU N modulo the count, so ``pytest -n auto`` spreads workers
over every GPU and no two workers of the first round share one.
"""

from __future__ import annotations

import os
import re

import torch


def worker_index(worker_id: str | None = None) -> int | None:
    """0 for gw0, 1 for gw1, ...; None outside xdist."""
    worker_id = worker_id if worker_id is not None else os.environ.get("PYTEST_XDIST_WORKER")
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(match.group(1)) if match else None


def gpu_for_worker(worker: int | None, gpu_count: int) -> int | None:
    """The GPU index a worker uses: worker modulo the number of GPUs; None without GPUs."""
    if gpu_count <= 0:
        return None
    return 0 if worker is None else worker % gpu_count


def native_gpu() -> bool:
    """Whether implementations run natively on a GPU here: there is one, and Triton was not told to
    interpret (TRITON_INTERPRET=1 puts Triton kernels on the CPU). Decided without importing any
    implementation, so that testing one never sets up another's runtime."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on")


def default_device() -> torch.device:
    """This process's device: its own GPU when implementations run natively, else the CPU."""
    if not native_gpu():
        return torch.device("cpu")
    index = gpu_for_worker(worker_index(), torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def case_budget():
    """How big hypothesis may draw cases here: small under the interpreter, larger on a GPU."""
    from oracle.cases import CPU_BUDGET, GPU_BUDGET

    return GPU_BUDGET if native_gpu() else CPU_BUDGET
