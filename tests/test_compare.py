"""The metrics and the verdict (oracle/verdict/) on crafted tensors with known answers."""

from __future__ import annotations

import collections
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from oracle import verdict as compare
from oracle.declare import reference as R
from oracle.ops import rms_norm as norm_ops
from oracle.verdict import Noise, Spread, bit_identical, judge, summation_noise, ulp_distance, ulp_of, ulps_of

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
    h = norm_ops.llama_rms_norm(x, w, 1e-6)
    t = R.truth(norm_ops.llama_rms_norm, x, w, 1e-6)
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

    fp32 = judge("Y", divides_by_n_minus_1(x, w), norm_ops.llama_rms_norm(x, w, 1e-6), R.truth(norm_ops.llama_rms_norm, x, w, 1e-6))
    assert not fp32.passed and fp32.error_ratio > 1000
    xb, wb = x.bfloat16(), w.bfloat16()
    bf16 = judge("Y", divides_by_n_minus_1(xb, wb), norm_ops.llama_rms_norm(xb, wb, 1e-6),
                 R.truth(norm_ops.llama_rms_norm, xb, wb, 1e-6))
    assert bf16.passed and bf16.bit_identical < 0.9  # visible only as lost bit-identity


def test_reordered_evaluation_raises_the_floor_under_cancellation():
    t = torch.tensor([1e-7], dtype=torch.float64)
    h = torch.tensor([1e-7], dtype=torch.float32)  # HF exact by luck
    reordered = torch.tensor([1.6e-7], dtype=torch.float32)  # the other valid order is not
    k = torch.tensor([1.5e-7], dtype=torch.float32)
    assert not judge("dX", k, h, t).passed
    assert judge("dX", k, h, t, reordered=reordered).passed


def test_summation_noise():
    terms = torch.tensor([4.0, 1.0], dtype=torch.float64)
    noise = summation_noise(terms, 16, torch.float32)
    assert noise == pytest.approx(2 * 4 * 2.0**-24 * 4.0)
    assert summation_noise(torch.empty(0), 3, torch.float32) == 0.0


# --- the per-element and distribution judgements (Note [The per-element judgement], [...distribution...])


def _bf16_case(seed: int = 0, n: int = 4096):
    """A bf16 result rounded once from its float64 truth, as HF's maths does: noise-free terms."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=gen, dtype=torch.float64) * torch.rand(n, generator=gen, dtype=torch.float64)
    return t, t.bfloat16(), torch.zeros(n, dtype=torch.float64)


def test_ulps_of_matches_ulp_of_per_element():
    values = [1.0, 3.0, 1e-3, 6e-8, 0.0, -2.5, 1e30]
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        got = ulps_of(torch.tensor(values, dtype=torch.float64), dtype)
        assert got.tolist() == [ulp_of(v, dtype) for v in values], dtype


def test_hf_itself_and_an_equally_accurate_order_pass_all_three():
    """Gemma's cast order used for Llama (scale in fp32, round once): as accurate as HF, other bits.
    Judged with the spec's own noise model, it passes every judgement; it shows as drift only."""
    from oracle.declare.registry import SPECS

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=gen).bfloat16()
    w = (1 + 0.1 * torch.randn(256, generator=gen)).bfloat16()
    noise = SPECS["rms_norm"].noise["Y"]({"X": x, "W": w, "eps": 1e-6, "gemma": False}, {})
    h, t = norm_ops.llama_rms_norm(x, w, 1e-6), R.truth(norm_ops.llama_rms_norm, x, w, 1e-6)
    assert judge("Y", h.clone(), h, t, noise=Noise(element_noise=noise)).passed
    v = judge("Y", _llama_norm(x, w, 1e-6, cast_then_scale=False), h, t, noise=Noise(element_noise=noise))
    assert v.passed, v.reason
    assert v.bit_identical < 0.95 and v.mean_error <= v.hf_mean_error


def test_small_elements_zeroed_fail_per_element_though_the_max_norm_passes():
    """SwiGLU's "flush |h| < 0.1 to zero": the largest elements are untouched, so max|k - t| stays
    below one ULP of the largest value; judged at their own scale the zeroed elements are far off."""
    t, h, noise = _bf16_case(1)
    k = torch.where(h.abs() < 0.01, torch.zeros_like(h), h)
    max_norm_only = judge("h", k, h, t)
    assert max_norm_only.passed  # the old verdict's blind spot
    v = judge("h", k, h, t, noise=Noise(element_noise=noise))
    assert not v.passed and v.element_failures > 0 and "own value" in v.reason and "what HF's maths" in v.reason
    assert abs(t[v.element_worst["index"][0]]) < 0.01


def test_precision_lost_everywhere_fails_the_distribution_though_every_element_is_inside():
    """A kernel one rounding step coarser everywhere (an intermediate kept in bf16): every element
    within 2 of its scale, yet the typical error is well above HF's."""
    t, h, noise = _bf16_case(2)
    coarse = (t.float() * (1 + 2.0**-9)).bfloat16()  # a relative error of half a bf16 ULP before the rounding
    v = judge("h", coarse, h, t, noise=Noise(element_noise=noise))
    assert v.element_max <= 2.0
    assert not v.passed and v.mean_error > v.mean_bound and "typical error" in v.reason
    assert v.over_1ulp >= v.hf_over_1ulp


def test_the_distribution_bound_allows_a_few_elements_of_chance():
    """A tensor of a handful of elements is judged by the per-element rule: one element half an ULP
    worse than HF's is within the sampling allowance."""
    t = torch.tensor([1.0 + 2.0**-9], dtype=torch.float64)  # exactly halfway between two bf16 values
    h = t.bfloat16()
    k = next_float(h) if h.double().item() < t.item() else h - (next_float(h) - h)
    v = judge("h", k, h, t, noise=Noise(element_noise=torch.zeros(1, dtype=torch.float64)))
    assert v.passed, v.reason


def test_element_noise_gives_room_under_cancellation():
    """An element that is a small difference of large terms: one ULP of the terms is its room."""
    t = torch.tensor([1e-4, 1.0], dtype=torch.float64)
    h = t.bfloat16()
    k = h.clone()
    k[0] = k[0] + 3e-3  # 3e-3 off a 1e-4 result: hundreds of its own ULPs, under one ULP of terms of size 1
    assert not judge("y", k, h, t, noise=Noise(element_noise=torch.zeros(2, dtype=torch.float64))).passed
    room = Noise(element_noise=torch.tensor([2.0**-8, 0.0], dtype=torch.float64))
    assert judge("y", k, h, t, noise=room).element_max <= 2.0


def _gemma_norm_summed_in_order(x: torch.Tensor, w: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """Gemma's RMSNorm with the sum of squares accumulated one column after another in ``dtype``."""
    x32 = x.float()
    total = torch.zeros(x.shape[:-1], dtype=dtype)
    for j in range(x.shape[-1]):
        total = total + x32[..., j].to(dtype) ** 2
    r = torch.rsqrt(total.float() / x.shape[-1] + eps)
    return (x32 * r[..., None] * (1.0 + w.float())).to(x.dtype)


def test_another_summation_order_passes_in_fp32_and_a_16_bit_sum_fails():
    """Inductor's column-major reduction (torch.compile's order of a row's sum of squares) in
    miniature: the sum of squares accumulated sequentially in fp32 moves every element of a row by
    the same few u_c, a mean error several times HF's; the spec's order noise gives exactly that
    room. The same sum kept in bf16 is a precision loss the distribution judgement still sees."""
    from oracle.declare.registry import SPECS

    spec = SPECS["rms_norm"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2047, generator=gen)
    w = 0.1 * torch.randn(2047, generator=gen)
    args = {"X": x, "W": w, "eps": 1e-6, "gemma": True}
    noise, order = spec.noise["Y"](args, {}), spec.order_noise["Y"](args, {})
    h, t = norm_ops.gemma_rms_norm(x, w, 1e-6), R.truth(norm_ops.gemma_rms_norm, x, w, 1e-6)
    sequential = _gemma_norm_summed_in_order(x, w, 1e-6, torch.float32)
    without_room = judge("Y", sequential, h, t, noise=Noise(element_noise=noise))
    assert not without_room.passed and without_room.mean_error > 3 * without_room.hf_mean_error
    v = judge("Y", sequential, h, t, noise=Noise(element_noise=noise, order_noise=order))
    assert v.passed, v.reason

    xb, wb = x.bfloat16(), w.bfloat16()
    args_b = {"X": xb, "W": wb, "eps": 1e-6, "gemma": True}
    hb, tb = norm_ops.gemma_rms_norm(xb, wb, 1e-6), R.truth(norm_ops.gemma_rms_norm, xb, wb, 1e-6)
    noise_b, order_b = spec.noise["Y"](args_b, {}), spec.order_noise["Y"](args_b, {})
    fp32_sum = _gemma_norm_summed_in_order(xb, wb, 1e-6, torch.float32)
    v = judge("Y", fp32_sum, hb, tb, noise=Noise(element_noise=noise_b, order_noise=order_b))
    assert v.passed, v.reason
    # in 16-bit the order room is negligible: the bound stays where HF's own errors put it
    assert v.mean_bound - judge("Y", fp32_sum, hb, tb, noise=Noise(element_noise=noise_b)).mean_bound < 1e-3
    v = judge("Y", _gemma_norm_summed_in_order(xb, wb, 1e-6, torch.bfloat16), hb, tb,
              noise=Noise(element_noise=noise_b, order_noise=order_b))
    assert not v.passed and "typical error" in v.reason


def test_an_infinity_where_hf_has_nan_but_the_truth_an_infinity_passes():
    """torch's float32 CPU gelu(+inf) is NaN (its vectorised erf), the float64 truth +inf: a kernel
    returning +inf is right, one returning NaN is HF's answer; a finite value or -inf is neither."""
    t = torch.tensor([math.inf, 1.0], dtype=torch.float64)
    h = torch.tensor([math.nan, 1.0])
    for k, ok in ((torch.tensor([math.inf, 1.0]), True), (torch.tensor([math.nan, 1.0]), True),
                  (torch.tensor([-math.inf, 1.0]), False), (torch.tensor([3.0e38, 1.0]), False)):
        assert judge("h", k, h, t).passed == ok, k
    # where HF and the truth agree on NaN, an infinity is still a mismatch
    nan64 = torch.tensor([math.nan], dtype=torch.float64)
    assert not judge("h", torch.tensor([math.inf]), torch.tensor([math.nan]), nan64).passed


def test_an_infinity_that_is_the_truth_rounded_passes_where_hf_stayed_finite():
    """Found on Unsloth's fp16 RMSNorm: an all-zero row with eps=1e-12 has dX = -65520.26 exactly,
    past fp16's overflow threshold (65520), so the correctly rounded answer is -inf; HF's order of
    roundings gives -65504. The kernel's -inf is right; an infinity of the other sign, or one where
    the truth rounds to a finite value, is not."""
    h = torch.tensor([-65504.0, 1.0], dtype=torch.float16)
    t = torch.tensor([-65520.2568, 1.0], dtype=torch.float64)
    for k, ok in ((torch.tensor([-math.inf, 1.0]), True), (torch.tensor([-65504.0, 1.0]), True),
                  (torch.tensor([math.inf, 1.0]), False), (torch.tensor([math.nan, 1.0]), False)):
        assert judge("dX", k.half(), h, t).passed == ok, k
    below = torch.tensor([-65519.0, 1.0], dtype=torch.float64)  # rounds to -65504: an infinity is wrong
    assert not judge("dX", torch.tensor([-math.inf, 1.0]).half(), h, below).passed


class _HostReads(TorchDispatchMode):
    """Counts the ops that make the host wait for a device's result: a scalar read, and the ops whose
    output size depends on the data (a boolean mask's indexing goes through nonzero)."""

    WAITS = ("aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default")

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in self.WAITS:
            self.count[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fails", (False, True), ids=("passing", "failing"))
def test_a_verdict_reads_the_device_once_beside_its_percentile(monkeypatch, fails):
    """Note [One read per verdict]: every judgement's scalars in one transfer (``tolist`` of one
    stacked tensor), plus the 99th percentile's one read; the verdict read one scalar at a time
    took ~80 host waits."""
    reads = []
    read = compare.Readback.read
    monkeypatch.setattr(compare.Readback, "read", lambda self: reads.append(len(self.queued)) or read(self))
    t = torch.randn(64, 512, dtype=torch.float64)
    h = t.to(torch.bfloat16)
    k = (t * (1.01 if fails else 1.0)).to(torch.bfloat16)
    noise = t.abs() * 2.0 ** -8
    with _HostReads() as waits:
        noise_model = Noise(element_noise=noise, order_noise=noise / 4, spread=Spread(sd=noise, terms=512))
        verdict = judge("Y", k, h, t, reordered=h, noise=noise_model)
    assert verdict.passed is not fails and verdict.spread_bound > 0 and verdict.element_worst
    assert len(reads) == 1 and reads[0] > 40, reads
    assert waits.count == {"aten._local_scalar_dense.default": 1}, waits.count  # the percentile
