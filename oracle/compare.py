"""Drift metrics and the pass/fail verdict (design.md §3). Tests, the report and the gate all use this.

For each compared tensor: k = the implementation under test, h = HF's maths in the test dtype,
t = the truth (HF's maths on float64 copies of the same inputs).

Note [The verdict]
    k passes iff it is non-finite exactly where h is (NaN where h has NaN, +inf where +inf, ...)
    and, over the elements finite in all three,

        max|k - t|  <=  2 * max|h - t|  +  floor

    In words: no worse than twice the error HF itself makes at this dtype. That is scale-free and
    needs no per-dtype tolerance. ``floor`` is the rounding noise an implementation is entitled to
    even where HF happens to be exact or lucky:

        floor = one ULP of max|t| in the tensor's dtype
                + 2 * max(0, max|h_reordered - t| - max|h - t|)

                + sum_noise

    where h_reordered is the same maths in the same dtype evaluated in another valid order
    (reference.py). So the bound is twice the larger error of HF's two valid evaluation orders, plus
    one ULP. The second term matters under cancellation: the dX of a one-column RMSNorm is ~1e-7
    built from terms of order 1, so its error is noise at the terms' scale, and which order is
    luckier on a given input is chance; a floor tied to the output's size alone would fail any
    kernel that evaluates in the other order (FlashAttention's reasoning, design.md §3).

    ``sum_noise`` covers results built by adding up terms, where the maximum over a handful of
    elements is a single draw of the rounding noise (the dW of a one-column RMSNorm is one sum over
    the rows; its dX a difference of two nearly equal terms): 2 * sqrt(n) * u * max(sum of |terms|),
    the typical error of adding n terms in any order with the accumulator's unit roundoff u. Specs
    declare which outputs are such sums, and their terms (specs.py).

Beside the verdict: max/mean abs error, max rel error, ULP distance to h (max, p99, mean, and a
histogram; bits reinterpreted per dtype, +0 and -0 equal, NaN vs NaN distance 0, elements with a
non-finite on either side left out and counted as non-finite mismatches when the classes differ),
the fraction of elements bit-identical to h (which is what reveals HF's cast order), and the error
ratio max|k - t| / max|h - t|.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

ULP_BINS = ("0", "1", "2", "3-4", "5-8", "9-16", "17-256", ">256")
_ULP_EDGES = (0, 1, 2, 4, 8, 16, 256)  # upper bounds of all bins but the last

_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}
_MAGNITUDE = {torch.int16: 0x7FFF, torch.int32: 0x7FFFFFFF, torch.int64: 0x7FFFFFFFFFFFFFFF}


@dataclass(frozen=True)
class TensorVerdict:
    """Everything known about one compared tensor; plain data (``asdict`` goes to JSON)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    passed: bool
    reason: str  # empty when passed
    max_abs: float  # max |k - t|
    mean_abs: float
    max_rel: float  # max |k - t| / |t| over t != 0
    hf_max_abs: float  # max |h - t|
    truth_max_abs: float  # max |t|: the tensor's scale
    error_ratio: float  # max_abs / hf_max_abs
    floor: float
    bound: float  # 2 * hf_max_abs + floor: what max_abs had to stay under
    ulp_max: float  # ULP distance to h
    ulp_p99: float
    ulp_mean: float
    ulp_histogram: dict[str, int]
    bit_identical: float  # fraction of elements with h's exact bits
    nonfinite_mismatches: int
    nonfinite_k: int  # non-finite elements in k
    worst: dict  # index and k, h, t values at the largest |k - t|; or at the first non-finite mismatch

    def to_dict(self) -> dict:
        return asdict(self)


def ulp_of(value: float, dtype: torch.dtype) -> float:
    """Spacing of ``dtype`` at |value| (its ULP there)."""
    info = torch.finfo(dtype)
    value = abs(value)
    if not math.isfinite(value):
        return math.inf
    if value < info.tiny:
        return info.smallest_normal * info.eps  # subnormal spacing
    return info.eps * 2.0 ** math.floor(math.log2(value))


def _ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """Integers that order like the floats and count ULPs between them (+0 and -0 both map to 0)."""
    bits = x.contiguous().view(_BITS[x.dtype]).to(torch.int64)
    magnitude = bits & _MAGNITUDE[_BITS[x.dtype]]
    return torch.where(bits < 0, -magnitude, magnitude)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-element ULP distance between same-dtype tensors, as float64 (exact below 2**53)."""
    oa, ob = _ordered_bits(a), _ordered_bits(b)
    same_sign = (oa >= 0) == (ob >= 0)
    # int64 subtraction is exact when signs agree; across zero it can overflow for fp64, so go through floats
    return torch.where(same_sign, (oa - ob).abs().double(), oa.double().abs() + ob.double().abs())


def bit_identical(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-element: same bits, treating +0/-0 as equal and any NaN as equal to any NaN."""
    return (_ordered_bits(a) == _ordered_bits(b)) | (a.isnan() & b.isnan())


def _nonfinite_class(x: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +inf, 3 -inf."""
    cls = torch.zeros(x.shape, dtype=torch.int8, device=x.device)
    cls[x.isnan()] = 1
    cls[x == math.inf] = 2
    cls[x == -math.inf] = 3
    return cls


def _histogram(ulps: torch.Tensor) -> dict[str, int]:
    counts, low = {}, -1
    for label, high in zip(ULP_BINS, _ULP_EDGES + (math.inf,)):
        counts[label] = int(((ulps > low) & (ulps <= high)).sum())
        low = high
    return counts


def _index(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in torch.unravel_index(torch.tensor(flat_index), shape)] if shape else []


def judge(name: str, k: torch.Tensor, h: torch.Tensor, t: torch.Tensor, h_reordered: torch.Tensor | None = None,
          sum_noise: float = 0.0) -> TensorVerdict:
    """Compare k (implementation) with h (HF, same dtype) and t (float64 truth); see Note [The verdict]."""
    problems = []
    if tuple(k.shape) != tuple(h.shape):
        raise ValueError(f"{name}: shape {tuple(k.shape)} differs from HF's {tuple(h.shape)}")
    if k.dtype != h.dtype:
        problems.append(f"dtype {k.dtype} differs from HF's {h.dtype}")
        k = k.to(h.dtype)
    # Stay on the tensors' device: full-size GPU cases are too big to ship to the host.
    k, h = k.detach(), h.detach().to(k.device)
    t = t.detach().to(device=k.device, dtype=torch.float64)
    k64, h64 = k.to(torch.float64), h.to(torch.float64)

    # Non-finite placement: classes must agree element for element.
    k_cls, h_cls = _nonfinite_class(k), _nonfinite_class(h)
    nonfinite_mismatch = k_cls != h_cls
    n_mismatch = int(nonfinite_mismatch.sum())
    if n_mismatch:
        problems.append(f"{n_mismatch} element(s) non-finite where HF is not, or the reverse")

    # Errors against the truth over elements finite everywhere.
    finite = (k_cls == 0) & (h_cls == 0) & torch.isfinite(t)
    k_err = torch.where(finite, (k64 - t).abs(), 0.0)
    h_err = torch.where(finite, (h64 - t).abs(), 0.0)
    max_abs, hf_max_abs = _max(k_err), _max(h_err)
    mean_abs = float(k_err.sum() / max(1, int(finite.sum())))
    nonzero_t = finite & (t != 0)
    max_rel = _max(torch.where(nonzero_t, k_err / t.abs().clamp_min(1e-300), 0.0))

    # The floor: one ULP at the truth's scale, plus what the other valid order loses beyond HF.
    scale = _max(torch.where(finite, t.abs(), 0.0))
    floor = ulp_of(scale, h.dtype)
    if h_reordered is not None:
        h2 = h_reordered.detach().to(device=k.device, dtype=torch.float64)
        both = finite & torch.isfinite(h2)
        reordered_max_abs = _max(torch.where(both, (h2 - t).abs(), 0.0))
        floor += 2 * max(0.0, reordered_max_abs - hf_max_abs)
    floor += sum_noise
    bound = 2 * hf_max_abs + floor
    if max_abs > bound:
        problems.append(f"max|k-t| = {max_abs:.3g} exceeds 2*max|h-t| + floor = {bound:.3g}")

    # Distance to HF in its own dtype.
    ulps = ulp_distance(k, h)[finite]
    identical = bit_identical(k, h)

    if n_mismatch:
        flat = int(nonfinite_mismatch.flatten().nonzero()[0])
    else:
        flat = int(k_err.flatten().argmax()) if k.numel() else 0
    worst = {"index": _index(flat, tuple(k.shape)), "k": _item(k64, flat), "h": _item(h64, flat), "t": _item(t, flat)} \
        if k.numel() else {}

    return TensorVerdict(
        name=name, dtype=str(h.dtype).removeprefix("torch."), shape=tuple(k.shape),
        passed=not problems, reason="; ".join(problems),
        max_abs=max_abs, mean_abs=mean_abs, max_rel=max_rel, hf_max_abs=hf_max_abs, truth_max_abs=scale,
        error_ratio=_ratio(max_abs, hf_max_abs), floor=floor, bound=bound,
        ulp_max=_max(ulps), ulp_p99=_quantile(ulps, 0.99), ulp_mean=float(ulps.mean()) if ulps.numel() else 0.0,
        ulp_histogram=_histogram(ulps),
        bit_identical=float(identical.float().mean()) if k.numel() else 1.0,
        nonfinite_mismatches=n_mismatch, nonfinite_k=int((k_cls != 0).sum()), worst=worst,
    )


def _max(x: torch.Tensor) -> float:
    return float(x.max()) if x.numel() else 0.0


def _quantile(x: torch.Tensor, q: float) -> float:
    if not x.numel():
        return 0.0
    k = max(1, math.ceil(q * x.numel()))
    return float(x.flatten().kthvalue(k).values)


def _ratio(k_err: float, h_err: float) -> float:
    if h_err > 0:
        return k_err / h_err
    return 0.0 if k_err == 0 else math.inf


def _item(x: torch.Tensor, flat: int) -> float:
    return float(x.flatten()[flat])


def summation_noise(sum_of_abs_terms: torch.Tensor, n_terms: int, accumulator: torch.dtype) -> float:
    """2 * sqrt(n) * u * max(sum |terms|): the typical rounding error of a sum in any order."""
    if not sum_of_abs_terms.numel():
        return 0.0
    unit_roundoff = torch.finfo(accumulator).eps / 2
    return 2.0 * math.sqrt(max(1, n_terms)) * unit_roundoff * float(sum_of_abs_terms.max())
