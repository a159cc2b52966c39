"""One intra-op thread for torch while a test of the module that imports this runs.

The tests of tests/test_models.py, test_compile.py, test_kernels.py and test_kernel_paths.py run
tiny problems (a one-layer model of hidden size 32, RMSNorm rows of a few hundred columns), whose
matrix products take microseconds on one thread and milliseconds on a thread pool whose cores are
busy: measured on the 2-core CPU machine under load, a float64 (16, 32) @ (32, 64) product took
16 ms on two threads and 0.01 ms on one. Under pytest-xdist the plugin already gives each worker
its share of the cores (``oracle.environment.share_cores``: one thread each when there are as many
workers as cores); this fixture keeps these tests as cheap in a run without workers (``-n 0``,
a single file while other work shares the machine). What a test checks does not depend on the
thread count (no test compares bits across thread counts); only its time does. The count is
restored after each test.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
