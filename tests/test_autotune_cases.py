"""Autotuned kernels under the engine (oracle/cases/autotune.py, Note [One config per case]): each case runs
one config, chosen by the case's number, so a run's cases judge every config, the same case always
runs the same one (its repro too), and the failure text names the config that judged it."""

from __future__ import annotations

import threading

import pytest
import torch

from oracle.cases import autotune
from oracle.cases import CPU_BUDGET
from oracle.engine import run_case
from oracle.declare.implementations import load
from oracle.declare.registry import SPECS

OP = "swiglu_fg_kernel"
# the large and non-finite cases overflow exp in the interpreter's numpy, as on a GPU (silently there)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture(scope="module")
def cases():
    # sizes that 128 does not divide come up among them, and both configs
    return SPECS[OP].stratified("bfloat16", CPU_BUDGET)


def _config_of(result) -> str:
    (config,) = result.configs
    return config


def test_every_config_is_judged_and_a_case_keeps_its_config(cases, device):
    impl = load("tests.autotuned_impls:right")
    results = [run_case(OP, case, impl, device) for case in cases]
    assert all(r.passed for r in results), [r.explain() for r in results if not r.passed]
    configs = {_config_of(r) for r in results}
    assert len(configs) == 2 and all("swiglu_fg: BLOCK: " in c for c in configs), configs
    again = run_case(OP, cases[0], impl, device)  # what its repro runs
    assert _config_of(again) == _config_of(results[0])
    assert "autotuned, judged with: " in again.explain() and _config_of(again) in again.explain()


def test_a_wrong_config_fails_the_cases_it_judged_and_is_named(cases, device):
    impl = load("tests.autotuned_impls:wrong_second_config")
    results = [run_case(OP, case, impl, device) for case in cases]
    by_config = {}
    for r in results:
        by_config.setdefault("SKIP_TAIL: True" in _config_of(r), []).append(r)
    assert set(by_config) == {True, False}, [_config_of(r) for r in results]
    assert all(r.passed for r in by_config[False]), [r.explain() for r in by_config[False] if not r.passed]
    failed = [r for r in by_config[True] if not r.passed]
    assert failed, [r.explain() for r in by_config[True]]
    assert all("autotuned, judged with: " in r.explain() and "SKIP_TAIL: True" in r.explain() for r in failed)


def test_the_pin_holds_on_autograds_backward_thread(device):
    """Autograd runs a GPU backward on a thread of its own: a launch there runs the case's config too
    (a per-thread pin left Liger's DyT backward benchmarking 18 configs at every width on the H200).
    Under the interpreter an unpinned launch runs the first config, so config 1 shows the pin held."""
    e, g = torch.randn(300, device=device), torch.randn(300, device=device)
    launch = load("tests.autotuned_impls:right").op(OP)
    with autotune.pinned(1):
        thread = threading.Thread(target=launch, args=(e, g))
        thread.start()
        thread.join()
        chosen = autotune.chosen()
    assert len(chosen) == 1 and "BLOCK: 128" in chosen[0], chosen
