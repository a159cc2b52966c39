"""A declared reference that overflows (compare.py, Note [A reference that overflows]): where HF's
result is non-finite and the float64 truth a number of the dtype, a correct implementation passes,
judged against the truth with the noise model's room, and the declaration's problem is named;
``--impl hf`` (HF's own answer) fails there, saying which side is non-finite."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from oracle.cases import Case
from oracle.verdict import Noise, judge
from oracle.declare import Dim, Op, Tensor
from oracle.engine import CaseFailed, run_case
from oracle.declare.implementations import Implementation, load
from oracle.declare.registry import SPECS
from oracle.suite.test_contract import DeclarationNote, judged


def poly_norm(X):
    """x^3 / sqrt(mean(x^6)) in X's dtype: in float16 x^6 overflows once |x| > 6.3, and inf / inf is NaN."""
    return X ** 3 / (X ** 6).mean(-1, keepdim=True).sqrt()


def _in_float32(X, scale=1.0):
    x = X.float()
    return (x ** 3 / (x ** 6).mean(-1, keepdim=True).sqrt() * scale).to(X.dtype)


# Outliers (a hundredth of the elements times 1000) make some rows overflow and leave the others finite.
POLY_NORM = Op("poly_norm", reference=poly_norm, inputs={"X": Tensor("rows", "cols")},
               dims={"rows": Dim(1, 16, programs=True), "cols": Dim(1, 256)}, dtypes=("float16",),
               value_kinds=("outliers", "large"), outputs=("Y",))
SPEC = POLY_NORM.spec
MIXED = Case("poly_norm", "default", "float16", {"rows": 16, "cols": 64}, "contiguous", "outliers", {}, seed=3)
EVERY_ROW = Case("poly_norm", "default", "float16", {"rows": 3, "cols": 8}, "contiguous", "large", {}, seed=1)


def _impl(name: str, fn) -> Implementation:
    return Implementation(name, SimpleNamespace(poly_norm=fn))


def _correct_where_hf_is_finite(X):
    """Right where the float16 reference is finite, one percent off where it overflows."""
    right, off = _in_float32(X), _in_float32(X, 1.01)
    return torch.where(torch.isfinite(poly_norm(X)), right, off)


# (not named ``case``: the plugin would take it for a built-in op's case and skip an op not asked)
@pytest.mark.parametrize("drawn", [MIXED, EVERY_ROW], ids=["some-rows", "every-row"])
def test_a_correct_implementation_passes_and_the_overflow_is_named(drawn, device):
    result = run_case(SPEC, drawn, _impl("float32", _in_float32), device)
    text = result.explain()
    assert result.passed, text
    overflowed = {v.name: v.reference_nonfinite for v in result.verdicts}
    assert overflowed["Y"] > 0 and overflowed["dX"] > 0, text
    if drawn is MIXED:  # the rows that stay finite are judged as usual, against HF
        assert all(v.reference_nonfinite < math.prod(v.shape) for v in result.verdicts), text
    assert "declaration problem: HF's reference gives" in text and "overflows in float16" in text, text
    with pytest.warns(DeclarationNote, match="overflows in float16"):  # the generic suite's word of it
        judged(result)


@pytest.mark.parametrize("drawn", [MIXED, EVERY_ROW], ids=["some-rows", "every-row"])
def test_hf_fails_such_a_declaration_naming_the_side_that_is_non_finite(drawn, device):
    result = run_case(SPEC, drawn, _impl("hf", SPEC.contract_callable()), device)
    text = result.explain()
    assert result.status == "fail", text
    assert "non-finite in k where the float64 truth is finite; HF's reference is non-finite there too" in text, text
    assert "(k NaN, HF NaN)" in text and "declaration problem" in text, text
    with pytest.raises(CaseFailed, match="overflows in float16"):
        judged(result)


def test_where_hf_overflows_the_implementation_is_still_judged(device):
    """One percent off where HF is non-finite (and right elsewhere) fails against the truth there."""
    result = run_case(SPEC, MIXED, _impl("off", _correct_where_hf_is_finite), device)
    text = result.explain()
    assert result.status == "fail", text
    (y,) = [v for v in result.verdicts if v.name == "Y"]
    assert not y.passed and "where HF's reference is non-finite off the float64 truth" in y.reason, text
    assert y.nonfinite_mismatches == 0 and y.reference_element_max > 2, text


def test_the_judgement_on_known_numbers():
    """HF NaN and inf where the truth is 3 and -2: k = the truth rounded passes, k a few ULPs off fails,
    k non-finite fails naming both sides, and without a noise model the elements are judged at one ULP."""
    t = torch.tensor([3.0, -2.0, 1.0], dtype=torch.float64)
    h = torch.tensor([math.nan, math.inf, 1.0], dtype=torch.float16)
    noise = torch.zeros(3, dtype=torch.float64)
    good = judge("Y", t.half(), h, t, noise=Noise(element_noise=noise))
    assert good.passed and good.reference_nonfinite == 2 and good.reference_worst["index"] == [0], good.reason
    off = t.half().clone()
    off[1] = -2.0 - 4 * 2 ** -9  # four float16 ULPs at 2
    bad = judge("Y", off, h, t, noise=Noise(element_noise=noise))
    assert not bad.passed and "where HF's reference is non-finite" in bad.reason
    assert judge("Y", t.half(), h, t).passed and not judge("Y", off, h, t).passed  # no noise model: one ULP
    like_hf = judge("Y", h.clone(), h, t, noise=Noise(element_noise=noise))
    assert not like_hf.passed and like_hf.nonfinite_mismatches == 2
    assert "2 element(s) non-finite in k where the float64 truth is finite" in like_hf.reason
    # a truth past float16's range is not a number of the dtype: HF's infinity stays the answer
    beyond = torch.tensor([1e6, 1.0], dtype=torch.float64)
    h_inf = torch.tensor([math.inf, 1.0], dtype=torch.float16)
    v = judge("Y", h_inf.clone(), h_inf, beyond, noise=Noise(element_noise=torch.zeros(2, dtype=torch.float64)))
    assert v.passed and v.reference_nonfinite == 0


def test_other_non_finite_mismatches_say_which_side_is_non_finite():
    t = torch.tensor([1.0, math.nan, math.inf], dtype=torch.float64)
    h = t.float()
    k = torch.tensor([math.nan, 2.0, -math.inf])
    reason = judge("y", k, h, t).reason
    assert "1 element(s) non-finite in k where HF is finite; first at [0]: k=nan h=1 t=1 (k NaN, HF finite)" in reason
    assert "1 element(s) finite in k where HF is non-finite; first at [1]" in reason
    assert "1 element(s) non-finite in k and in HF, but not alike" in reason and "(k -inf, HF +inf)" in reason


def test_an_infinity_within_reach_of_the_overflow_threshold_passes():
    """Where HF overflows, an infinity of the truth's sign passes if a value the per-element judgement
    allows there rounds to it: the truth -65515.1 is 4.9 short of float16's threshold (65520) where the
    spacing is 32. +inf and NaN do not pass, nor -inf where the truth is far from the threshold, unless
    the noise there reaches it."""
    h = torch.tensor([-math.inf, 1.0], dtype=torch.float16)
    t = torch.tensor([-65515.1, 1.0], dtype=torch.float64)
    quiet = Noise(element_noise=torch.zeros(2, dtype=torch.float64))
    for k, ok in ((-math.inf, True), (-65504.0, True), (math.inf, False), (math.nan, False)):
        assert judge("dX", torch.tensor([k, 1.0]).half(), h, t, noise=quiet).passed == ok, k
    far = torch.tensor([-30000.0, 1.0], dtype=torch.float64)
    assert not judge("dX", h.clone(), h, far, noise=quiet).passed
    assert judge("dX", h.clone(), h, far, noise=Noise(element_noise=torch.tensor([20000.0, 0.0]))).passed


def test_the_case_that_found_it_passes_under_the_kernels(device):
    """The built-in RMSNorm, float16 dX of tiny rows under large gradients: HF and the kernel give
    -inf, bit for bit, where the truth is -65515.1 (this verdict failed the kernel before)."""
    case = Case.from_json('{"dims": {"cols": 4096, "lead": [6, 5]}, "dtype": "float16", "grad_layout": '
                          '"transposed", "grad_values": "large", "layout": "contiguous", "op": "rms_norm", "params": '
                          '{"eps": 1e-06, "weight": "same"}, "seed": 2, "values": "tiny", "variant": "llama"}')
    result = run_case(SPECS["rms_norm"], case, load("kernels"), device)
    (dx,) = [v for v in result.verdicts if v.name == "dX"]
    assert result.passed and dx.reference_nonfinite == 1, result.explain()
    assert dx.reference_worst["index"] == [4, 4, 2754] and dx.reference_worst["k"] == -math.inf, dx.reference_worst
