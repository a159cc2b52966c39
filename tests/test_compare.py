"""The metrics and the verdict (oracle/compare.py) on crafted tensors with known answers."""

from __future__ import annotations

import math

import pytest
import torch

from oracle import reference as R
from oracle.compare import bit_identical, judge, summation_noise, ulp_distance, ulp_of

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


def next_float(x: torch.Tensor) -> torch.Tensor:
    """The next representable value above a positive x, by its bits."""
    return (x.view(_INT[x.dtype]) + 1).view(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_and_its_next_float_are_one_ulp_apart(dtype):
    one = torch.ones(1, dtype=dtype)
    assert ulp_distance(one, next_float(one)).item() == 1
    assert next_float(one).item() - 1.0 == torch.finfo(dtype).eps
    assert ulp_of(1.0, dtype) == torch.finfo(dtype).eps


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_signed_zeros_and_nans(dtype):
    zeros = torch.tensor([0.0, -0.0], dtype=dtype)
    assert ulp_distance(zeros[:1], zeros[1:]).item() == 0
    assert bit_identical(zeros[:1], zeros[1:]).item()
    tiny = torch.tensor([torch.finfo(dtype).smallest_normal], dtype=dtype)
    assert ulp_distance(tiny, -tiny).item() == 2 * ulp_distance(tiny, torch.zeros_like(tiny)).item()
    nan = torch.tensor([math.nan], dtype=dtype)
    assert bit_identical(nan, -nan).item() and not bit_identical(nan, zeros[:1]).item()


def test_ulp_distance_spans_sign_and_magnitude():
    x = torch.tensor([1.0, -1.0, 2.0], dtype=torch.bfloat16)
    y = torch.tensor([1.0078125, -1.0078125, 2.0], dtype=torch.bfloat16)  # bf16 has 7 mantissa bits
    assert ulp_distance(x, y).tolist() == [1, 1, 0]
    big = torch.tensor([1e300, -1e300], dtype=torch.float64)
    assert ulp_distance(big[:1], big[1:]).item() > 2**62  # across zero, without overflowing


def _truth(h: torch.Tensor) -> torch.Tensor:
    return h.double()


def test_error_ratio_and_bound_on_known_numbers():
    t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    h = (t + torch.tensor([0.0, 1e-3, 0.0], dtype=torch.float64)).float()
    k = (t + torch.tensor([0.0, 0.0, 2e-3], dtype=torch.float64)).float()
    v = judge("y", k, h, t)
    assert v.error_ratio == pytest.approx(2.0, rel=1e-3)
    assert v.max_abs == pytest.approx(2e-3, rel=1e-3) and v.hf_max_abs == pytest.approx(1e-3, rel=1e-3)
    assert v.bound == pytest.approx(2e-3 + ulp_of(3.0, torch.float32), rel=1e-3)
    assert v.passed  # exactly twice HF's error is still within the bound
    assert v.bit_identical == pytest.approx(1 / 3)
    worse = judge("y", (t + torch.tensor([0.0, 0.0, 3e-3], dtype=torch.float64)).float(), h, t)
    assert not worse.passed and "exceeds" in worse.reason and worse.worst["index"] == [2]


def test_ulp_statistics_and_histogram():
    h = torch.ones(100, dtype=torch.float32)
    k = h.clone()
    k[:3] = next_float(h[:3])
    k[3] = next_float(next_float(h[3:4]))[0]
    v = judge("y", k, h, h.double())
    assert v.ulp_max == 2 and v.ulp_p99 == 1 and v.ulp_mean == pytest.approx(0.05)
    assert v.ulp_histogram["0"] == 96 and v.ulp_histogram["1"] == 3 and v.ulp_histogram["2"] == 1
    assert v.bit_identical == pytest.approx(0.96)


def test_nan_where_hf_has_none_fails_and_where_hf_has_one_passes():
    t = torch.tensor([1.0, math.nan, 3.0], dtype=torch.float64)
    h = t.float()
    assert judge("y", h.clone(), h, t).passed
    k = h.clone()
    k[0] = math.nan
    v = judge("y", k, h, t)
    assert not v.passed and v.nonfinite_mismatches == 1 and v.worst["index"] == [0]
    missing = h.clone()
    missing[1] = 2.0  # a number where HF has NaN
    assert not judge("y", missing, h, t).passed


def test_inf_sign_must_match():
    t = torch.tensor([math.inf, 1.0], dtype=torch.float64)
    h = t.half()
    assert judge("y", h.clone(), h, t).passed
    assert not judge("y", -h, h, t).passed


def test_dtype_differing_from_hf_fails_but_is_measured():
    t = torch.linspace(-1, 1, 11, dtype=torch.float64)
    v = judge("y", t.float(), t.bfloat16(), t)
    assert not v.passed and "dtype" in v.reason
    assert v.max_abs == v.hf_max_abs  # measured after casting to HF's dtype


def _llama_norm(x, w, eps, cast_then_scale: bool):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype) if cast_then_scale else (w.float() * h).to(x.dtype)


def test_cast_order_slip_shows_in_bit_identity_but_passes_the_ratio():
    """Gemma's cast order used for Llama (scale in fp32, round once) is as accurate, not HF's bits."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=gen).bfloat16()
    w = (1 + 0.1 * torch.randn(256, generator=gen)).bfloat16()
    h = R.llama_rms_norm(x, w, 1e-6)
    t = R.truth(R.llama_rms_norm, x, w, 1e-6)
    slipped = _llama_norm(x, w, 1e-6, cast_then_scale=False)
    v = judge("Y", slipped, h, t)
    assert v.passed, v
    assert 0.5 < v.bit_identical < 0.95
    assert judge("Y", _llama_norm(x, w, 1e-6, cast_then_scale=True), h, t).bit_identical == 1.0


def test_a_real_bug_fails_the_ratio():
    """Dividing by n - 1 instead of n: 0.2% off. Drowned in bf16's rounding (ULP 0.4-0.8%), so only a
    verdict in fp32 can see it, and it must."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=gen)
    w = 1 + 0.1 * torch.randn(256, generator=gen)

    def divides_by_n_minus_1(x, w):
        return w * (x.float() * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) / 255 + 1e-6)).to(x.dtype)

    fp32 = judge("Y", divides_by_n_minus_1(x, w), R.llama_rms_norm(x, w, 1e-6), R.truth(R.llama_rms_norm, x, w, 1e-6))
    assert not fp32.passed and fp32.error_ratio > 1000
    xb, wb = x.bfloat16(), w.bfloat16()
    bf16 = judge("Y", divides_by_n_minus_1(xb, wb), R.llama_rms_norm(xb, wb, 1e-6),
                 R.truth(R.llama_rms_norm, xb, wb, 1e-6))
    assert bf16.passed and bf16.bit_identical < 0.9  # visible only as lost bit-identity


def test_reordered_evaluation_raises_the_floor_under_cancellation():
    t = torch.tensor([1e-7], dtype=torch.float64)
    h = torch.tensor([1e-7], dtype=torch.float32)  # HF exact by luck
    reordered = torch.tensor([1.6e-7], dtype=torch.float32)  # the other valid order is not
    k = torch.tensor([1.5e-7], dtype=torch.float32)
    assert not judge("dX", k, h, t).passed
    assert judge("dX", k, h, t, h_reordered=reordered).passed


def test_summation_noise():
    terms = torch.tensor([4.0, 1.0], dtype=torch.float64)
    noise = summation_noise(terms, 16, torch.float32)
    assert noise == pytest.approx(2 * 4 * 2.0**-24 * 4.0)
    assert summation_noise(torch.empty(0), 3, torch.float32) == 0.0
