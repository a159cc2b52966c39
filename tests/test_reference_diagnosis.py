"""Where a declared reference goes non-finite, the statement of it to change (oracle/checks/overflow.py,
Note [Naming the statement that overflows]): float16 squares that overflow (then inf / inf), and
squares that underflow to 0 before an rsqrt, are each named by file, line and source text; the same
maths computed in float32, as Hugging Face's norms compute it, gets nothing; ``--impl hf`` fails
naming the line."""

from __future__ import annotations

import inspect
import os
from types import SimpleNamespace

import pytest
import torch

from oracle.cases import Case
from oracle.checks import overflow
from oracle.declare import Dim, Op, Tensor
from oracle.declare.implementations import Implementation
from oracle.engine import CaseFailed, run_case
from oracle.suite.test_contract import DeclarationNote, judged


def half_energy(X, W, eps):
    """Each element's share of its row's mean square, in X's dtype: float16 squares overflow past
    256, and inf / inf is NaN where the float64 truth is a number near 1."""
    sq = X * X
    return W * (sq / (sq.mean(-1, keepdim=True) + eps))


def float_energy(X, W, eps):
    """The same in float32, rounded once to X's dtype."""
    sq = X.float() * X.float()
    return W * (sq / (sq.mean(-1, keepdim=True) + eps)).to(X.dtype)


def half_norm(X, W, eps):
    """RMSNorm as an eager module computes it, in X's dtype: float16 squares flush to 0 below about
    1.7e-4, and rsqrt(0) is inf where eps is 0."""
    var = (X * X).mean(-1, keepdim=True)
    return W * (X * torch.rsqrt(var + eps))


def float_norm(X, W, eps):
    """The same maths as Hugging Face's LlamaRMSNorm computes it: in float32, rounded once to X's dtype."""
    h = X.float()
    h = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + eps)
    return W * h.to(X.dtype)


def _tiny(shape, dtype, gen, device):
    """Values near 3e-5: squares near 1e-9, far below float16's smallest subnormal (6e-8)."""
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 3e-5).to(dtype).to(device)


def _op(name, reference, values, eps):
    return Op(name, reference=reference, inputs={"X": Tensor("rows", "cols", values=values),
                                                 "W": Tensor("cols", values="weight")},
              dims={"rows": Dim(1, 8, programs=True), "cols": Dim(1, 64)}, dtypes=("float16",),
              params={"eps": eps}, outputs=("Y",))


# The overflow: large values (1000 N(0, 1)) with the usual eps; the underflow: tiny ones with eps 0.
LARGE_HALF = _op("half_energy", half_energy, "large", 1e-6)
LARGE_FLOAT = _op("float_energy", float_energy, "large", 1e-6)
TINY_HALF, TINY_FLOAT = _op("half_sq_norm", half_norm, _tiny, 0.0), _op("float_sq_norm", float_norm, _tiny, 0.0)


def _case(op) -> Case:
    """X's values are the op's own (large or tiny) whatever the case's kind."""
    return Case(op.name, "default", "float16", {"rows": 4, "cols": 16}, "contiguous", "normal", {}, seed=2)


def _impl(name: str, op, fn) -> Implementation:
    return Implementation(name, SimpleNamespace(**{op.name: fn}))


def _at(fn, text: str) -> str:
    """``at file:line `text``` of the line of ``fn`` holding ``text``, the file as the diagnosis shows it."""
    lines, first = inspect.getsourcelines(fn)
    (line,) = [first + i for i, source in enumerate(lines) if text in source]
    path = os.path.relpath(__file__)
    return f"at {__file__ if path.startswith(os.pardir) else path}:{line} `{text}`"


SQUARES = "var = (X * X).mean(-1, keepdim=True)"
RSQRT = "return W * (X * torch.rsqrt(var + eps))"
# Per kind of values: the float16 op, the float32 one, the line a diagnosis names, and what it says happened.
KINDS = {"large": (LARGE_HALF, LARGE_FLOAT, _at(half_energy, "sq = X * X"), "overflows"),
         "tiny": (TINY_HALF, TINY_FLOAT, _at(half_norm, SQUARES), "underflows")}


def _diagnosis(op) -> str:
    spec = op.spec
    return overflow.diagnose(spec, spec.make_args(_case(op), torch.device("cpu")))


def test_an_overflow_is_named_by_its_statement():
    text = _diagnosis(LARGE_HALF)
    assert text.startswith(f"HF's reference first overflows in float16 {_at(half_energy, 'sq = X * X')}: aten.mul "
                           "gives inf from finite inputs (largest |input| "), text
    assert "float16's largest finite value 65504); compute this step in float32 (`X.float()` before it" in text, text


def test_an_underflow_is_named_with_the_step_it_breaks():
    text = _diagnosis(TINY_HALF)
    square, rsqrt = _at(half_norm, SQUARES), _at(half_norm, RSQRT).split(" `")[0]
    assert text.startswith(f"HF's reference first underflows in float16 {square}: aten.mul gives 0 where the exact "
                           "value is "), text
    assert f"(float16's smallest normal is 6.1e-05); aten.rsqrt {rsqrt} then gives inf; compute this step" in text, text


@pytest.mark.parametrize("kind", KINDS)
def test_the_engine_names_the_statement_and_float32_gets_nothing(kind, device):
    """A correct implementation passes with the statement named once; the float32 reference, on the
    same inputs, has no declaration problem and no diagnosis."""
    half, wide, at, what = KINDS[kind]
    result = run_case(half.spec, _case(half), _impl("float32", half, wide.reference), device)
    text = result.explain()
    assert result.passed, text
    assert result.reference_diagnosis.startswith(f"HF's reference first {what} in float16 {at}"), text
    assert text.count(f"declaration problem: {result.reference_diagnosis}") == 1, text
    assert "compute it in a wider dtype" not in text, text  # the generic advice gives way to the statement
    assert result.to_dict()["reference_diagnosis"] == result.reference_diagnosis
    with pytest.warns(DeclarationNote, match="first (over|under)flows in float16 at .*test_reference_diagnosis"):
        judged(result)
    assert overflow.find_steps(wide.spec, wide.spec.make_args(_case(wide), device))[:2] == (None, None)
    correct = run_case(wide.spec, _case(wide), _impl("float32", wide, wide.reference), device)
    assert correct.passed and correct.reference_diagnosis == "" and not correct.declaration_problems, correct.explain()


@pytest.mark.parametrize("kind", KINDS)
def test_impl_hf_fails_naming_the_line(kind, device):
    op, _, at, what = KINDS[kind]
    result = run_case(op.spec, _case(op), _impl("hf", op, op.spec.contract_callable()), device)
    assert result.status == "fail", result.explain()
    with pytest.raises(CaseFailed) as failed:
        judged(result)
    assert f"declaration problem: HF's reference first {what} in float16 {at}" in str(failed.value)


def half_magnitude(X, W, eps):
    """|x| as sqrt(x * x) in X's dtype: its forward stays finite (0 where x * x flushes to 0), its
    derivative x / sqrt(x * x) is inf there."""
    return W * (X * X + eps).sqrt()


def float_magnitude(X, W, eps):
    x = X.float()
    return W * (x * x + eps).sqrt().to(X.dtype)


MAGNITUDE = _op("half_magnitude", half_magnitude, _tiny, 0.0)
FLOAT_MAGNITUDE = _op("float_magnitude", float_magnitude, _tiny, 0.0)


def test_a_forward_that_stays_finite_names_its_underflow(device):
    """Only a gradient is non-finite: the forward's underflow is named as the likely cause; the float32
    reference on the same inputs gets nothing."""
    result = run_case(MAGNITUDE.spec, _case(MAGNITUDE), _impl("hf", MAGNITUDE, half_magnitude), device)
    assert [v.name for v in result.verdicts if v.reference_nonfinite] == ["dX"], result.explain()
    assert result.reference_diagnosis.startswith(
        "HF's reference is finite in its forward on this case's inputs, so its non-finite values are its gradients'"
        f", which autograd computes in its dtypes; a likely cause, its forward first underflows in float16 "
        f"{_at(half_magnitude, 'return W * (X * X + eps).sqrt()')}: aten.mul gives 0 where"), result.explain()
    correct = run_case(FLOAT_MAGNITUDE.spec, _case(FLOAT_MAGNITUDE), _impl("f32", FLOAT_MAGNITUDE, float_magnitude),
                       device)
    assert correct.passed and correct.reference_diagnosis == "", correct.explain()


def in_place_norm(X, W, eps):
    """Squares X where it lies, as a memory-saving module might."""
    X.mul_(X)
    return W * X / X.mean(-1, keepdim=True).sqrt()


def test_the_arguments_are_not_changed():
    args = {"X": torch.full((2, 8), 300.0, dtype=torch.float16), "W": torch.ones(8, dtype=torch.float16), "eps": 0.0}
    before = {name: t.clone() for name, t in args.items() if isinstance(t, torch.Tensor)}
    spec = SimpleNamespace(reference=in_place_norm, call=lambda fn, a: (fn(a["X"], a["W"], a["eps"]),))
    text = overflow.diagnose(spec, args)
    assert text.startswith(f"HF's reference first overflows in float16 {_at(in_place_norm, 'X.mul_(X)')}: aten.mul_ "
                           "gives inf from finite inputs (largest |input| 300,"), text
    assert all(torch.equal(args[name], t) for name, t in before.items())


def _square(x):
    return x * x


def with_a_helper(X, W, eps):
    """An underflow that does not reach the culprit is not blamed: exp(-x/5) flushes to 0 and is only
    added; the culprit is a square in a helper of this file, named at the helper's line."""
    faded = torch.exp(-X.abs() / 5)
    return faded + _square(X) * W


def test_a_helper_is_named_and_an_unrelated_underflow_is_not():
    args = {"X": torch.full((2, 8), 300.0, dtype=torch.float16), "W": torch.ones(8, dtype=torch.float16), "eps": 0.0}
    spec = SimpleNamespace(reference=with_a_helper, call=lambda fn, a: (fn(a["X"], a["W"], a["eps"]),))
    culprit, cause, _ = overflow.find_steps(spec, args)
    assert cause is None and culprit.op == "aten.mul" and culprit.statement.text == "return x * x"
    expected = f"HF's reference first overflows in float16 {_at(_square, 'return x * x')}"
    assert overflow.diagnose(spec, args).startswith(expected)


def test_a_failing_diagnosis_gives_a_line_not_an_exception(monkeypatch, device):
    def broken(*args, **kwargs):
        raise RuntimeError("no stack here")

    monkeypatch.setattr(overflow, "statement", broken)
    expected = "the step where HF's reference goes non-finite could not be located (the diagnosis raised RuntimeError)"
    assert _diagnosis(LARGE_HALF).startswith(expected)
    result = run_case(LARGE_HALF.spec, _case(LARGE_HALF), _impl("float32", LARGE_HALF, float_energy), device)
    assert result.passed and result.reference_diagnosis.startswith(expected), result.explain()
    assert f"declaration problem: {expected}" in result.explain()
