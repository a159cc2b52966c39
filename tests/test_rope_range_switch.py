"""RoPE's range assertion has a public switch (kernels/rope.py, ``without_range_assertion``), and the
benchmark that times what the check costs (oracle/bench, ``position_check_cost`` and
``rope_check_share``) uses it and the module's public check, loaded as ``--impl kernels`` loads the
kernels, instead of a private of the kernels."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from oracle import bench

ROOT = Path(__file__).parent.parent


@pytest.fixture
def rope_module():
    return bench._rope_module()


def test_the_benchmark_finds_this_checkouts_rope_module(rope_module):
    assert Path(rope_module.__file__).resolve() == ROOT / "kernels" / "rope.py"


def test_the_switch_compiles_the_kernel_without_the_assertion_and_restores_it(rope_module, monkeypatch):
    compiled = SimpleNamespace(debug=True)  # a GPU's JIT function: ``debug`` compiles the assertion in
    monkeypatch.setattr(rope_module, "_rope_kernel", compiled)
    with rope_module.without_range_assertion():
        assert compiled.debug is False
    assert compiled.debug is True
    with pytest.raises(RuntimeError, match="inside"), rope_module.without_range_assertion():
        raise RuntimeError("inside")
    assert compiled.debug is True


def test_the_switch_leaves_an_interpreted_kernel_alone(rope_module, monkeypatch):
    interpreted = SimpleNamespace()  # the interpreter never compiles the assertion
    monkeypatch.setattr(rope_module, "_rope_kernel", interpreted)
    with rope_module.without_range_assertion():
        assert not hasattr(interpreted, "debug")
    assert not hasattr(interpreted, "debug")


def test_the_host_check_is_timed_through_the_checkouts_module():
    rows = bench.position_check_cost(shapes=((1, 16),), calls=2, repeats=2)
    assert [(row["batch"], row["seq"]) for row in rows] == [(1, 16)] and rows[0]["best_us_per_call"] > 0


def test_the_benchmark_names_no_private_of_the_kernels():
    source = inspect.getsource(bench)
    assert "_rope_kernel" not in source and "from kernels" not in source and "\nimport kernels" not in source
