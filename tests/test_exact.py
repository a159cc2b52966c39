"""Exactness as a contract (oracle/checks/exact.py, Note [Exact bits]): an implementation's EXACT or
an op's ``exact`` makes every case compare those tensors' bits with HF's. RoPE rounded once (both
products and their sum fused in float32) is as precise as HF, so the verdict passes it; promised
HF's cast order, as the kernels promise it, it fails per case and in the gate, naming how many
elements differ and the first. The kernels themselves keep the promise."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from oracle import DeclarationError, Dim, Op, Tensor, implementation
from oracle import engine
from oracle.cases import CPU_BUDGET
from oracle.declare.implementations import Implementation, load
from oracle.declare.registry import SPECS
from oracle.engine.devices import default_device
from tests import broken_impls


def _rope_cases(dtype: str) -> list:
    """Two short stratified cases of normal values, a plain and a packed one (a long packed case is
    most of a second's programs on the interpreter, and rounds no differently)."""
    spec = SPECS["rope"]
    return [case for case in spec.stratified(dtype, CPU_BUDGET) if case.values == "normal" and not spec.long(case)][:2]


def _exact_findings(result) -> dict[str, object]:
    return {f.tensor: f for f in result.findings if f.check == "exact"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rounding_once_breaks_the_promise_per_case_and_keeps_the_verdict(dtype):
    promised = load("tests.broken_impls:rope_rounds_once")
    unpromised = Implementation("rounds-once-unpromised", SimpleNamespace(rope=broken_impls.rope_rounds_once.rope))
    for case in _rope_cases(dtype):
        broken = engine.run_case(SPECS["rope"], case, promised, default_device())
        assert broken.status == "fail" and all(v.passed for v in broken.verdicts), broken.explain()
        found = _exact_findings(broken)
        assert {"Q_out", "K_out"} <= set(found), broken.explain()
        first = found["Q_out"]
        count = int(first.message.split(" of ")[0])
        assert 0 < count and first.index is not None and first.expected != first.found, first.describe()
        assert "differ from HF's bits" in first.describe() and "EXACT promises" in first.describe()
        # the same arithmetic, promising nothing: the verdict alone passes it (a changed rounding is drift)
        assert engine.run_case(SPECS["rope"], case, unpromised, default_device()).passed


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_kernels_keep_their_promise(dtype):
    kernels = load("kernels")
    assert kernels.exact(SPECS["rope"]) == dict.fromkeys(SPECS["rope"].compared(), "bits")
    for case in _rope_cases(dtype):
        result = engine.run_case(SPECS["rope"], case, kernels, default_device())
        assert result.passed and not _exact_findings(result), result.explain()


def test_in_float32_rounding_once_is_hf_and_keeps_the_promise():
    promised = load("tests.broken_impls:rope_rounds_once")
    for case in _rope_cases("float32"):
        assert engine.run_case(SPECS["rope"], case, promised, default_device()).passed


def test_the_gate_fails_a_broken_promise(tmp_path, report_main):
    """The report in-process (a subprocess's start-up is most of a run this small on a GPU machine)."""
    paths = ("--json", tmp_path / "run.json", "--html", tmp_path / "run.html", "--baseline", tmp_path / "baseline.json")
    grid = ("--ops", "rope", "--dtypes", "bfloat16", "--variants", "plain", "--no-checks", "--workers", "1", *paths)
    code, out, err = report_main(*grid, "--update-baseline")
    assert code == 0, out + err
    code, out, err = report_main(*grid, "--gate", "--impl", "tests.broken_impls:rope_rounds_once")
    assert code == 1, out + err
    assert "new finding of the exact check on Q_out" in out, out
    cases = json.loads((tmp_path / "run.json").read_text())["cases"]
    findings = [f for case in cases for f in case.get("findings") or () if f["check"] == "exact"]
    assert findings and all(f["index"] is not None and "differ from HF's bits" in f["message"] for f in findings)


# --- an op's own contract, and the mistakes ---------------------------------------------------------

def _scaled(**options) -> Op:
    """X times 0.1: HF rounds the product of X and float32's 0.1; exactly 0.1 rounds differently."""
    return Op("scaled_tenth_exact", reference=lambda X: X * 0.1, inputs={"X": Tensor("rows", "cols")},
              dims={"rows": Dim(1, 8, programs=True), "cols": Dim(1, 64)}, dtypes=("float32",),
              value_kinds=("normal",), differentiable=(), outputs=("Y",), **options)


def test_an_ops_exact_binds_every_implementation():
    spec = _scaled(exact=("Y",)).spec
    assert spec.exact == {"Y": "bits"}
    same = Implementation("same", SimpleNamespace(scaled_tenth_exact=lambda X: X * 0.1))
    rounded_once = Implementation("once", SimpleNamespace(scaled_tenth_exact=lambda X: (X.double() * 0.1).float()))
    cases = spec.stratified("float32", CPU_BUDGET)
    assert all(engine.run_case(spec, case, same, "cpu").passed for case in cases)
    results = [engine.run_case(spec, case, rounded_once, "cpu") for case in cases]
    assert all(all(v.passed for v in r.verdicts) for r in results)  # as precise as HF
    found = [_exact_findings(r)["Y"] for r in results if "Y" in _exact_findings(r)]
    assert found and "the op scaled_tenth_exact promises" in found[0].message, [r.explain() for r in results]


def test_an_op_without_exact_keeps_a_changed_rounding_as_drift():
    spec = _scaled().spec
    rounded_once = Implementation("once", SimpleNamespace(scaled_tenth_exact=lambda X: (X.double() * 0.1).float()))
    assert all(engine.run_case(spec, case, rounded_once, "cpu").passed for case in spec.stratified("float32", CPU_BUDGET))


def test_mistakes_are_named():
    with pytest.raises(DeclarationError, match=r"exact: 'Z' is not a compared tensor \(Y\)"):
        _scaled(exact=("Z",))
    with pytest.raises(DeclarationError, match="exact: must be a tuple"):
        _scaled(exact="Y")
    with pytest.raises(DeclarationError, match=r"EXACT=\.\.\.\): must be a dict of op"):
        implementation(rope=broken_impls.rope_rounds_once.rope, EXACT="rope")
    with pytest.raises(DeclarationError, match="a string is not split into names"):
        implementation(rope=broken_impls.rope_rounds_once.rope, EXACT={"rope": "Q_out"})
    stray = Implementation("stray", SimpleNamespace(rope=broken_impls.rope_rounds_once.rope, EXACT={"rope": {"Y"}}))
    with pytest.raises(ValueError, match=r"declares EXACT\['rope'\] = \['Y'\], which rope does not compare"):
        stray.select(["rope"])
    with pytest.raises(DeclarationError, match="'ropee' is not a registered op"):
        Implementation("unknown", implementation(rope=broken_impls.rope_rounds_once.rope, EXACT={"ropee": True}))
