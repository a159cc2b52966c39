"""One reference, written as HF writes it (float32 inside), and a declared rounding point for a kernel
that stores an activation in 16 bits (oracle/noise/saved.py, Note [Saved activations in the input
dtype]): the memory-saving norm of tests/sixteen_bit_norm.py, whose backward recomputes normed from
its stored output, fails without the declaration where the incoming gradient lies along the output,
is told what to declare, and passes with it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from oracle import DeclarationError, implementation
from oracle import engine, noise
from oracle.cases import CPU_BUDGET
from oracle.declare.implementations import Implementation, prepared
from oracle.engine.devices import default_device
from oracle.noise.saved import storage_dtype


def _module():
    return prepared("tests.sixteen_bit_norm")


def _implementation(module, build: str) -> Implementation:
    """The build's op and declarations, as a namespace: the norm is not registered in this process
    (other tests in it read the registry), so the names are not checked against it."""
    target = getattr(module, build)
    return Implementation(build, SimpleNamespace(wide_rms_norm=target.wide_rms_norm, NO_FLOAT64=target.NO_FLOAT64,
                                                 SAVED_IN_INPUT_DTYPE=getattr(target, "SAVED_IN_INPUT_DTYPE", False)))


def _case(module, dtype: str, kind: str, seed: int = 0):
    first = module.WIDE_RMS_NORM.spec.stratified(dtype, CPU_BUDGET)[0]
    return dataclasses.replace(first, dims={"rows": 8, "cols": 256}, values="normal", layout="contiguous",
                               grad_layout="contiguous", grad_values=kind, seed=seed)


def _run(module, build: str, dtype: str, kind: str) -> engine.CaseResult:
    return engine.run_case(module.WIDE_RMS_NORM.spec, _case(module, dtype, kind), _implementation(module, build),
                           default_device())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_backward_from_the_stored_output_passes_only_when_it_declares_the_rounding(dtype):
    module = _module()
    declared, undeclared = (_run(module, build, dtype, "aligned") for build in ("saved_output", "saved_output_undeclared"))
    assert declared.passed, declared.explain()
    assert [v.name for v in declared.verdicts if v.needed_saved_room] == ["dX"]  # the room is used, and said
    assert "room of activations saved in the input dtype" in declared.explain()
    assert [v.name for v in undeclared.verdicts if not v.passed] == ["dX"], undeclared.explain()
    assert len(undeclared.hints) == 1 and "dX would pass" in undeclared.hints[0] and "SAVED_IN_INPUT_DTYPE" in \
        undeclared.hints[0] and f"rounded to {dtype}" in undeclared.hints[0]
    assert "hint: dX would pass" in undeclared.explain()


def test_a_random_gradient_and_the_float32_backward_need_no_declaration():
    module = _module()
    normal = _run(module, "saved_output_undeclared", "float16", "normal")
    assert normal.passed and not normal.hints, normal.explain()
    correct = _run(module, "correct", "float16", "aligned")
    assert correct.passed and not any(v.needed_saved_room for v in correct.verdicts)


def _derived(dtype: torch.dtype, weight_dtype: torch.dtype, saved: bool):
    module = _module()
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(4, 64, generator=gen).to(dtype)
    W = (1 + 0.1 * torch.randn(64, generator=gen)).to(weight_dtype)
    with torch.no_grad():
        Y = module._llama_rms_norm(X, W, 1e-6)
    return noise.derive(module.WIDE_RMS_NORM.spec, {"X": X, "W": W, "eps": 1e-6}, {"Y": Y}, torch.float32, saved=saved)


def test_the_rounding_reaches_the_gradients_through_what_the_forward_saved_and_nothing_else():
    plain, saved = _derived(torch.float16, torch.float16, False), _derived(torch.float16, torch.float16, True)
    assert torch.equal(plain.variance["Y"], saved.variance["Y"])  # the forward is HF's
    assert torch.equal(plain.variance["dW"], saved.variance["dW"])  # dW reads normed, already 16-bit
    assert (saved.variance["dX"] >= plain.variance["dX"]).all() and saved.noise["dX"].max() > 2 * plain.noise["dX"].max()
    assert all(torch.equal(plain.truth[n], saved.truth[n]) for n in plain.truth)  # the truth is exact either way


def test_a_float32_case_and_a_float32_argument_are_left_whole():
    plain, saved = _derived(torch.float32, torch.float32, False), _derived(torch.float32, torch.float32, True)
    assert all(torch.equal(plain.variance[n], saved.variance[n]) for n in plain.variance)
    assert storage_dtype({"X": torch.zeros(2, dtype=torch.bfloat16), "W": torch.zeros(2)}) == torch.bfloat16
    assert storage_dtype({"X": torch.zeros(2), "eps": 1e-6}) is None


def test_a_wrong_declaration_is_named():
    with pytest.raises(DeclarationError, match="SAVED_IN_INPUT_DTYPE=...\\): must be True, False or a collection"):
        implementation(SAVED_IN_INPUT_DTYPE="everything")
    with pytest.raises(DeclarationError, match="'rms_nrom' is not a registered op"):
        Implementation("typo", implementation(SAVED_IN_INPUT_DTYPE={"rms_nrom"}))
    assert Implementation("all", implementation(SAVED_IN_INPUT_DTYPE=True)).saves_in_input_dtype("rms_norm")
    assert Implementation("set", implementation(SAVED_IN_INPUT_DTYPE={"rms_norm"})).saves_in_input_dtype("rms_norm")
    assert not Implementation("none", implementation()).saves_in_input_dtype("rms_norm")
