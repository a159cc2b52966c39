"""Drift metrics and the pass/fail verdict. Tests, the report and the gate all use this.

For each compared tensor: k = the implementation under test, h = HF's maths in the test dtype,
t = the truth (HF's maths on float64 copies of the same inputs), r = HF's maths evaluated in another
valid order (reference.py). The verdict has three judgements beside the placement of non-finite
values (k must be NaN where h is NaN, +inf where +inf, ...; where HF is NaN but the truth is an
infinity, that infinity is right too); a tensor passes only if all hold.

Note [The max-norm judgement] (the headline: FlashAttention's error ratio)

        max|k - t|  <=  2 * max|h - t|  +  floor

    No worse than twice the error HF itself makes at this dtype: scale-free, no per-dtype tolerance.
    ``floor`` is the rounding noise an implementation is entitled to even where HF happens to be
    exact or lucky: one ULP of max|t| in the tensor's dtype, plus 2 * max(0, max|r - t| - max|h - t|)
    (twice the larger error of HF's two valid orders, which matters under cancellation: the dX of a
    one-column RMSNorm is ~1e-7 built from terms of order 1), plus ``sum_noise`` for results that add
    up many terms (2 * sqrt(n) * u * max(sum of |terms|), specs declare them; a maximum over a handful
    of elements is a single draw of that noise), plus the largest term of the spec's noise model
    (Note [The per-element judgement]) where one is given.

    Alone it is too weak in 16-bit: one ULP at the largest element is as large as HF's whole error,
    so every small element may be off by that much, and a kernel that loses a bit everywhere passes.

Note [The per-element judgement]
    Each element is judged at its own scale. HF's maths computes element i by rounding a few
    intermediate terms and then the result; so its error there is at most about

        scale_i = ulp(t_i)  +  noise_i

    ulp(t_i): the spacing of the output dtype at the element's own truth: the final rounding (1/2 ULP)
    plus, for the two-rounding cast orders (Llama's ``w * h.to(dtype)``), one more half ULP.
    noise_i: the rounding of the terms the element is built from, at *their* scale, declared per op
    and tensor by the spec (specs.py, ``noise``) from the error analysis of HF's evaluation: e.g. for
    RoPE ``(|x c| + |rot(x) s|) * 2u`` (each product and the table row rounded to the model dtype), so
    where the output is a small difference of large terms the room is the terms', not the result's.
    The normalised error e_i = |k_i - t_i| / scale_i is then at most about 1 for HF by construction
    (measured on CPU, 40 drawn cases per op and dtype: HF's largest e_i is 0.99, in fp16 SwiGLU's h),
    and the judgement allows twice that:

        max_i e_i(k)  <=  ELEMENT_BOUND = 2

    So 3 ULPs of error on a small element count as much as 3 ULPs on the largest one.

Note [The distribution judgement]
    A kernel that loses precision everywhere (a missing upcast, a low-precision intermediate, a
    cruder sigmoid) keeps every element inside twice HF's worst case, yet its typical error grows.
    So the mean of e_i over the tensor is set against HF's:

        mean e(k)  <=  max(mean e(h), mean e(r))  +  |mean e(h) - mean e(r)|
                       +  mean(order_i / scale_i)  +  2 * mean(u_c |t| / scale)  +  4 * sd / sqrt(N)

    HF's two valid orders calibrate "as accurate as HF": an implementation may be as far above the
    worse of them as they are from each other (a different, equally accurate rounding order passes;
    it is drift, seen in bit-identity and by the gate). The third term is the part of the noise model
    that moves with the order of a long sum (``order_i``, declared by the spec; zero where nothing is
    summed). HF's other order keeps torch's reduction of a row, so it cannot show how far another
    equally valid order of that sum lands: Inductor's strided reduction over a column-major fp32 row
    of 2047 moves every element of the row by the same ~9 u_c, a mean error 9x HF's, and is as valid
    as torch's. In 16-bit that room is a thousandth of an ULP. The fourth lets a valid formula spend two
    more roundings in the compute dtype per element than HF's (Unsloth's silu slope has three
    products where torch's silu backward has two): it matters in fp32 and vanishes in 16-bit, where
    only the roundings to the 16-bit dtype count. The last is the sampling noise of a mean over N
    elements, four standard errors wide: sd is the larger spread of e(h) and e(r), and at least
    1/sqrt(12) (an error anywhere within one scale unit), so a tensor of a handful of elements is
    judged by the per-element rule. Reported beside it: the share of elements more than one ULP from
    the truth, for k and for h.

Note [The spread judgement]
    A long sum whose partial sums are rounded to a 16-bit dtype (Liger-Kernel 0.6.4's RMSNorm dW,
    its 16-row blocks summed in bfloat16: Liger #950) adds one more rounding's worth of noise to each
    element of a gradient of a few hundred elements. Its mean error grows by about half, which the
    distribution judgement, at four standard errors of a mean over 128 elements, barely sees. Its
    spread grows by more, and the derived noise model predicts the spread of a valid computation
    element by element: the variance sigma_i^2 of the sum's rounding noise, plus ulp(t_i)^2 / 12 for
    the last rounding. So for a tensor each of whose elements is a sum's output (``spread``: the
    model's sigma and how many terms each sum has), the mean squared error in those units is judged:

        Z(k) = mean (k_i - t_i)^2 / (sigma_i^2 + ulp_i^2 / 12)
             <=  max(Z(h), Z(r), 1)  +  4 * sd / sqrt(min(N, terms))

    Z is about 1 for HF by construction (0.7 to 1.0 at RMSNorm's bf16 dW over 131072 rows, where a
    float32 accumulation of unrounded products gives 0.5 to 0.6 and the bf16 partial sums 2.6 to
    3.3). sd is the larger spread of z^2 for h and r, at least sqrt(2) (a normal error's). The
    elements of a sum's output are independent draws but for what their sums share (a row's 1/rms in
    every column of dW): at most as many draws as each sum has terms, hence min(N, terms). Below
    SPREAD_MIN_DRAWS = 32 draws (a loss, a short sum) the spread is not judged: four standard errors
    of so few draws allow less than the per-element judgement does, and see nothing it misses. Only
    the derived model gives sigma, and only sums' outputs are judged so: elsewhere one shared
    rounding (a row's 1/rms in every element of Y) makes the whole tensor one draw.

The per-element and distribution judgements need a noise model; ``judge`` without ``element_noise``
applies the max-norm judgement only (and judges the elements of Note [A reference that overflows] at
one ULP of their truth).

Note [A reference that overflows]
    HF's maths in the test dtype may be non-finite where the float64 truth is finite and representable
    in that dtype: a declared reference that computes x^3 and x^6 in float16 overflows to inf, and
    inf / inf to NaN, where a computation in a wider dtype gives an ordinary number. That concerns a
    dtype whose range is narrower than that of the float32 an op computes it in (float16, not
    bfloat16): in float32 itself an overflow is the dtype's, met by any implementation, and there
    non-finite values must appear where HF has them, as everywhere else. HF's answer there
    is not what the op means, so the implementation is not held to it: it must be finite, and it is
    judged against the truth alone, per element, at the scale ulp(t_i) + noise_i, with noise_i the
    noise model's there (the derived model's is the rounding of the same computation without its
    overflow: the shadow evaluation is exact). HF has no error at such an element, so the max-norm
    and distribution judgements leave it out. The reference's overflow is the declaration's problem,
    and the verdict says so (``reference_nonfinite``, ``reference_worst``): a correct implementation
    passes with it named; ``--impl hf``, whose answer is HF's, fails there, which is how a declaration
    is checked. At the range's end an infinity can be an answer within that scale: where t_i plus
    ELEMENT_BOUND x (ulp(t_i) + noise_i) reaches the dtype's overflow threshold (65520 in float16), a
    value the judgement allows rounds to the infinity of t_i's sign, so k may be that infinity (found
    on the built-in RMSNorm: float16 dX of tiny rows under large gradients, t = -65515.1, 4.9 short of
    the threshold where the spacing is 32; HF's roundings and the kernel's, the same, give -inf).

Note [HF's own error is room]
    A noise model derived from the maths (oracle/noise, Note [The derived noise model]) knows how
    exactly each operation may round, not how HF's library rounds on this host: torch's CPU exact
    GeLU evaluates its erf to about 11 spacings of 1 where CUDA's erff is within 2, its CPU LayerNorm
    keeps 1/std in 16 bits. Whatever HF's library does is by definition what HF's maths can do, so
    with such a model (``hf_room``) each element's scale is ulp(t_i) + max(noise_i, |h_i - t_i|):
    an element may be twice as far from the truth as HF is there. The max-norm floor keeps the model's
    noise alone (HF's error already counts twice there).

Note [One read per verdict]
    Every number a judgement reads from a tensor (a maximum, a count, the worst element) is a
    device scalar, and reading one to the host waits for the device. Read one by one, a verdict took
    about 80 such waits and a case about 400; on a GPU that several test processes share, each wait
    also waits for the other processes' queued work, and a thorough example took about 1 s where it
    takes 0.1 s alone. So each judgement queues its scalars by name on a ``Readback`` and the
    verdict reads them in one transfer, then decides in Python. Two more reads stay: the 99th
    percentile of the ULP distances (kthvalue's rank depends on how many elements are judged), and
    the text of a failure of the non-finite placement or of a reference that overflows (rare).

Beside the verdict: max/mean abs error, max rel error, ULP distance to h (max, p99, mean, and a
histogram; bits reinterpreted per dtype, +0 and -0 equal, NaN vs NaN distance 0, elements with a
non-finite on either side left out and counted as non-finite mismatches when the classes differ),
the fraction of elements bit-identical to h (which is what reveals HF's cast order), and the error
ratio max|k - t| / max|h - t|.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

import torch

from oracle.noise import rounding
from oracle.noise.rounding import ulp_of  # noqa: F401 - the verdict's ULP, defined with every other rounding

ELEMENT_BOUND = 2.0  # Note [The per-element judgement]: twice what HF's maths can do at an element
SAMPLING_SDS = 4.0  # Note [The distribution judgement]: standard errors of a mean allowed as chance
SPREAD_MIN_DRAWS = 32  # Note [The spread judgement]: fewer independent draws say nothing of a spread
EXTRA_ROUNDINGS = 2  # Note [The distribution judgement]: compute-dtype roundings per element beyond HF's
ONE_ROUNDING_SD = 1 / math.sqrt(12)  # sd of an error spread evenly over one unit of an element's scale

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
    # Note [A reference that overflows]: elements where HF is non-finite and the truth a number of the
    # dtype (a declaration problem), and the first of them (index, k, h, t)
    reference_nonfinite: int = 0
    reference_worst: dict = field(default_factory=dict)
    reference_element_max: float | None = None  # max e_i(k) over them, judged against the truth alone
    # Note [The per-element judgement]: errors in units of each element's own scale (None: not judged)
    element_max: float | None = None  # max e_i(k)
    element_bound: float | None = None  # ELEMENT_BOUND
    hf_element_max: float | None = None  # max e_i(h)
    element_failures: int = 0  # elements with e_i(k) above the bound
    element_worst: dict = field(default_factory=dict)  # index, k, h, t, e and scale at the largest e_i(k)
    # Note [The distribution judgement]
    mean_error: float | None = None  # mean e_i(k)
    hf_mean_error: float | None = None  # mean e_i(h)
    reordered_mean_error: float | None = None  # mean e_i(r)
    mean_bound: float | None = None
    over_1ulp: float | None = None  # share of elements more than one ULP of their truth off, k
    hf_over_1ulp: float | None = None  # the same for h
    # Note [The spread judgement]: mean squared error in units of the derived model's variance (None: not judged)
    spread: float | None = None  # Z(k)
    hf_spread: float | None = None  # Z(h)
    reordered_spread: float | None = None  # Z(r)
    spread_bound: float | None = None
    # Which maths the noise model granted (oracle/noise/rounding.py, Note [Fast maths]): "fast" (the
    # default: Triton's exp, division, sqrt) or "exact" (an implementation's EXACT_MATHS); and whether
    # this tensor passed only thanks to the fast maths' room.
    maths: str = "exact"
    needed_fast_maths: bool = False
    # Whether it passed only thanks to the rounding of saved activations its implementation declares
    # (SAVED_IN_INPUT_DTYPE; oracle/noise/saved.py, Note [Saved activations in the input dtype]).
    needed_saved_room: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


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


class Readback:
    """Note [One read per verdict]: device scalars queued by name, then read to the host together."""

    def __init__(self):
        self.queued: dict[str, torch.Tensor] = {}

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self.queued[name] = value

    def read(self) -> dict[str, float]:
        if not self.queued:
            return {}
        # one stack per dtype, then one cast: a few kernels, not two per scalar
        by_dtype: dict[torch.dtype, list[str]] = {}
        for name, value in self.queued.items():
            by_dtype.setdefault(value.dtype, []).append(name)
        with torch.no_grad():  # every queued value is a 0-d tensor
            stacked = [torch.stack([self.queued[name] for name in names]).to(torch.float64)
                       for names in by_dtype.values()]
            values = torch.cat(stacked).tolist()
        return dict(zip([name for names in by_dtype.values() for name in names], values))


def _queue_histogram(q: Readback, ulps: torch.Tensor) -> None:
    """Counts of the judged ULP distances per ULP_BINS bin (unjudged elements are -1, in no bin)."""
    # bin i holds (edge[i-1], edge[i]]: the number of upper edges below a distance is its bin
    bins = torch.bucketize(ulps.flatten(), _ulp_edges(ulps.device), right=False)
    counts = torch.zeros(len(ULP_BINS) + 1, dtype=torch.int64, device=ulps.device)
    counts.scatter_add_(0, torch.where(ulps.flatten() < 0, len(ULP_BINS), bins), torch.ones_like(bins))
    for i, label in enumerate(ULP_BINS):
        q[f"ulp_bin {label}"] = counts[i]


@functools.lru_cache(maxsize=None)
def _ulp_edges(device: torch.device) -> torch.Tensor:
    """_ULP_EDGES on a device, made once: a copy from the host per verdict would wait for the device."""
    return torch.tensor(_ULP_EDGES, dtype=torch.float64, device=device)


def _index(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    """The row-major index of the flat_index-th element of a tensor of ``shape``."""
    index = []
    for size in reversed(shape):
        flat_index, i = divmod(flat_index, size)
        index.append(i)
    return index[::-1]


def _queue_element(q: Readback, prefix: str, flat: torch.Tensor, **tensors: torch.Tensor) -> None:
    """One element's flat index and its value in each of ``tensors``, queued under ``prefix``."""
    q[f"{prefix} flat"] = flat
    for name, x in tensors.items():
        q[f"{prefix} {name}"] = torch.take(x, flat)


def _read_element(v: dict, prefix: str, shape: tuple[int, ...], *names: str) -> dict:
    """What _queue_element queued, read: the element's index and its values by name."""
    return {"index": _index(int(v[f"{prefix} flat"]), shape)} | {name: v[f"{prefix} {name}"] for name in names}


@dataclass(frozen=True)
class Spread:
    """What Note [The spread judgement] needs of a sum's output: the derived model's standard
    deviation of its rounding noise per element (its last rounding left out), and how many terms
    each element sums."""

    sd: torch.Tensor
    terms: int


@dataclass(frozen=True)
class Noise:
    """What the noise model says of one compared tensor. The defaults say nothing: the max-norm
    judgement alone.

    - ``element_noise`` (float64, broadcastable to the truth): the rounding noise of each element's
      terms in HF's evaluation (Note [The per-element judgement]); without it only the max-norm
      judgement applies;
    - ``sum_noise``: a long sum's noise at the max norm (``summation_noise``);
    - ``order_noise``: the part of ``element_noise`` that another summation order moves (Note [The
      distribution judgement]); None where nothing is summed;
    - ``hf_room``: Note [HF's own error is room];
    - ``typical_room``: per element, how much a granted approximation (fast maths) moves a typical
      error beyond HF's; the distribution judgement allows its mean;
    - ``spread``: for a sum's output, the derived model's noise of it (Note [The spread judgement]).
    """

    sum_noise: float = 0.0
    element_noise: torch.Tensor | None = None
    order_noise: torch.Tensor | None = None
    hf_room: bool = False
    typical_room: torch.Tensor | None = None
    spread: Spread | None = None


@dataclass(frozen=True)
class _Sides:
    """The compared tensors on k's device: k and h in the judged dtype and as float64, the truth t
    and HF's other valid order r (float64; None where the op has none)."""

    k: torch.Tensor
    h: torch.Tensor
    t: torch.Tensor
    k64: torch.Tensor
    h64: torch.Tensor
    r: torch.Tensor | None

    @classmethod
    def on_device(cls, k: torch.Tensor, h: torch.Tensor, t: torch.Tensor, h_reordered: torch.Tensor | None) -> _Sides:
        # Stay on the tensors' device: full-size GPU cases are too big to ship to the host.
        k, h = k.detach(), h.detach().to(k.device)
        t = t.detach().to(device=k.device, dtype=torch.float64)
        r = h_reordered.detach().to(device=k.device, dtype=torch.float64) if h_reordered is not None else None
        return cls(k, h, t, k.to(torch.float64), h.to(torch.float64), r)

    @property
    def dtype(self) -> torch.dtype:
        return self.h.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.k.shape)


@dataclass(frozen=True)
class _Placement:
    """Each element's non-finite class on each side (``_nonfinite_class``), where HF's reference
    overflows (Note [A reference that overflows]) and where k's class is wrong."""

    k_cls: torch.Tensor
    h_cls: torch.Tensor
    reference_nonfinite: torch.Tensor
    mismatch: torch.Tensor
    n_mismatch: torch.Tensor  # a device scalar


@dataclass(frozen=True)
class _Errors:
    """|k - t|, |h - t| and |r - t| over the elements finite on every side (0 elsewhere): what every
    judgement reads."""

    sides: _Sides
    finite: torch.Tensor
    n_finite: torch.Tensor  # a device scalar
    k_err: torch.Tensor
    h_err: torch.Tensor
    r_err: torch.Tensor | None


def judge(name: str, k: torch.Tensor, h: torch.Tensor, t: torch.Tensor, noise: Noise = Noise(),
          reordered: torch.Tensor | None = None) -> TensorVerdict:
    """Compare k (implementation) with h (HF, same dtype) and t (float64 truth), against what the
    noise model says of the tensor (``Noise``); ``reordered``: HF's maths in another valid order,
    the floor under cancellation (float64 or h's dtype; None where the op has none)."""
    problems = []
    if tuple(k.shape) != tuple(h.shape):
        raise ValueError(f"{name}: shape {tuple(k.shape)} differs from HF's {tuple(h.shape)}")
    if k.dtype != h.dtype:
        problems.append(f"dtype {k.dtype} differs from HF's {h.dtype}")
        k = k.to(h.dtype)
    return _verdict(name, _Sides.on_device(k, h, t, reordered), noise, problems)


def _verdict(name: str, sides: _Sides, noise: Noise, problems: list[str]) -> TensorVerdict:
    """Every judgement's scalars queued, read in one transfer (Note [One read per verdict]), then
    concluded; appends to ``problems``, the failures found before."""
    q = Readback()
    placement = _queue_placement(q, sides, noise.element_noise)
    errors = _queue_errors(q, sides, placement)
    element_noise = _queue_element_noise(q, errors, noise)
    ulps = _queue_distance_to_hf(q, errors)
    if sides.k.numel():
        _queue_worst(q, errors, placement)
    if element_noise is not None:
        if noise.hf_room:
            element_noise = torch.maximum(element_noise, errors.h_err)
        _queue_element_and_distribution(q, errors, element_noise, (noise.order_noise, noise.typical_room))
        if noise.spread is not None:
            _queue_spread(q, errors, noise.spread)

    v = q.read()
    n, n_mismatch = int(v["finite"]), int(v["mismatches"])
    if n_mismatch:
        problems += _nonfinite_problems(placement, sides)
    extra = _max_norm(v, sides, noise.sum_noise, problems)
    if element_noise is not None:
        extra |= _conclude_element(v, n, sides.shape, problems)
        extra |= _conclude_distribution(v, n, problems)
        if noise.spread is not None:
            extra |= _conclude_spread(v, noise.spread, problems)
    extra |= _reference_overflow(v, sides, placement, noise.element_noise, problems)

    return TensorVerdict(
        name=name, dtype=str(sides.dtype).removeprefix("torch."), shape=sides.shape,
        passed=not problems, reason="; ".join(problems), mean_abs=v["mean_abs"], max_rel=v["max_rel"],
        ulp_max=v["ulp_max"], ulp_p99=_judged_quantile(ulps, n, 0.99), ulp_mean=v["ulp_sum"] / n if n else 0.0,
        ulp_histogram={label: int(v[f"ulp_bin {label}"]) for label in ULP_BINS},
        bit_identical=v["identical"] if sides.k.numel() else 1.0,
        nonfinite_mismatches=n_mismatch, nonfinite_k=int(v["nonfinite k"]),
        worst=_read_element(v, "worst", sides.shape, "k", "h", "t") if sides.k.numel() else {}, **extra,
    )


def _queue_placement(q: Readback, sides: _Sides, element_noise: torch.Tensor | None) -> _Placement:
    """Non-finite placement: classes must agree element for element, except where k is the truth
    correctly rounded to the dtype and that is an infinity HF missed: HF gives NaN for an infinite
    truth (torch's vectorised CPU erf makes gelu(+inf) NaN in float32), or HF stays finite where the
    truth lies past the dtype's overflow threshold (fp16 RMSNorm dX of an all-zero row: t = -65520.3
    rounds to -inf, HF's order of rounding gives -65504). Where HF is non-finite and the truth is a
    number of the dtype, k must be a number, or the infinity of the truth's sign where the judgement's
    scale there reaches the overflow threshold (Note [A reference that overflows])."""
    k_cls, h_cls = _nonfinite_class(sides.k), _nonfinite_class(sides.h)
    rounded_t_cls = _nonfinite_class(sides.t.to(sides.k.dtype))
    reference_nonfinite = (h_cls != 0) & (rounded_t_cls == 0) & _narrower_than_its_compute_dtype(sides.k.dtype)
    hf_missed_an_infinity = (h_cls <= 1) & (rounded_t_cls >= 2)
    expected_cls = torch.where(reference_nonfinite, torch.zeros_like(h_cls), h_cls)
    infinity_of_t = _nonfinite_class(torch.where(sides.t > 0, math.inf, -math.inf))
    overflow_allowed = reference_nonfinite & (k_cls == infinity_of_t) & _overflow_within_reach(sides, element_noise)
    mismatch = (k_cls != expected_cls) & ~(hf_missed_an_infinity & (k_cls == rounded_t_cls)) & ~overflow_allowed
    n_mismatch = mismatch.sum()
    q["mismatches"], q["reference nonfinite"] = n_mismatch, reference_nonfinite.sum()
    q["nonfinite k"] = (k_cls != 0).sum()
    return _Placement(k_cls, h_cls, reference_nonfinite, mismatch, n_mismatch)


def _queue_errors(q: Readback, sides: _Sides, placement: _Placement) -> _Errors:
    """Errors against the truth over the elements finite everywhere, and the max-norm judgement's
    scalars (Note [The max-norm judgement])."""
    t = sides.t
    finite = (placement.k_cls == 0) & (placement.h_cls == 0) & torch.isfinite(t)
    n_finite = finite.sum()
    q["finite"] = n_finite
    k_err = torch.where(finite, (sides.k64 - t).abs(), 0.0)
    h_err = torch.where(finite, (sides.h64 - t).abs(), 0.0)
    q["max_abs"], q["hf_max_abs"] = _max(k_err), _max(h_err)
    q["mean_abs"] = k_err.sum() / n_finite.clamp_min(1)
    nonzero_t = finite & (t != 0)
    q["max_rel"] = _max(torch.where(nonzero_t, k_err / t.abs().clamp_min(1e-300), 0.0))
    q["scale"] = _max(torch.where(finite, t.abs(), 0.0))
    r_err = None
    if sides.r is not None:
        both = finite & torch.isfinite(sides.r)
        r_err = torch.where(both, (sides.r - t).abs(), 0.0)
        q["r_max_abs"] = _max(r_err)
    return _Errors(sides, finite, n_finite, k_err, h_err, r_err)


def _queue_element_noise(q: Readback, errors: _Errors, noise: Noise) -> torch.Tensor | None:
    """The noise model's per-element noise at the truth's shape (None without a model), its largest
    term queued for the max-norm floor."""
    if noise.element_noise is None:
        return None
    t = errors.sides.t
    element_noise = noise.element_noise.to(device=t.device, dtype=torch.float64).expand(t.shape)
    # what HF's maths may lose at the tensor's largest terms, where HF happened to lose less
    q["noise_max"] = _max(torch.where(errors.finite & torch.isfinite(element_noise), element_noise, 0.0))
    return element_noise


def _queue_distance_to_hf(q: Readback, errors: _Errors) -> torch.Tensor:
    """The distance to HF in its own dtype over the judged elements (-1 elsewhere), its maximum,
    sum and histogram queued, and bit-identity with HF."""
    sides = errors.sides
    ulps = torch.where(errors.finite, ulp_distance(sides.k, sides.h), -1.0)
    judged_ulps = ulps.clamp_min(0)
    q["ulp_max"], q["ulp_sum"] = _max(judged_ulps), judged_ulps.sum()
    _queue_histogram(q, ulps)
    if sides.k.numel():
        q["identical"] = bit_identical(sides.k, sides.h).float().mean()
    return ulps


def _queue_worst(q: Readback, errors: _Errors, placement: _Placement) -> None:
    """The element a verdict names: the first non-finite mismatch, else the largest |k - t|."""
    first_mismatch = placement.mismatch.flatten().to(torch.uint8).argmax()
    flat = torch.where(placement.n_mismatch > 0, first_mismatch, errors.k_err.flatten().argmax())
    sides = errors.sides
    _queue_element(q, "worst", flat, k=sides.k64, h=sides.h64, t=sides.t)


def _max_norm(v: dict, sides: _Sides, sum_noise: float, problems: list[str]) -> dict:
    """Note [The max-norm judgement], concluded from the read scalars; appends to ``problems``."""
    max_abs, hf_max_abs, scale = v["max_abs"], v["hf_max_abs"], v["scale"]
    floor = ulp_of(scale, sides.dtype)
    if sides.r is not None:
        floor += 2 * max(0.0, v["r_max_abs"] - hf_max_abs)
    floor += sum_noise + v.get("noise_max", 0.0)
    bound = 2 * hf_max_abs + floor
    if max_abs > bound:
        problems.append(f"max|k-t| = {max_abs:.3g} exceeds 2*max|h-t| + floor = {bound:.3g} "
                        f"(error ratio {_ratio(max_abs, hf_max_abs):.3g} to HF's)")
    return {"max_abs": max_abs, "hf_max_abs": hf_max_abs, "truth_max_abs": scale,
            "error_ratio": _ratio(max_abs, hf_max_abs), "floor": floor, "bound": bound}


def _reference_overflow(v: dict, sides: _Sides, placement: _Placement, element_noise: torch.Tensor | None,
                        problems: list[str]) -> dict:
    """Note [A reference that overflows]: how many elements, the first, and k judged against the
    truth alone there (appending to ``problems``); nothing where HF's reference stays finite."""
    n_reference = int(v["reference nonfinite"])
    if not n_reference:
        return {}
    judged = placement.reference_nonfinite & (placement.k_cls == 0)
    extra = _against_the_truth_alone(sides, judged, element_noise, problems)
    first = int(placement.reference_nonfinite.flatten().nonzero()[0])
    return extra | {"reference_nonfinite": n_reference,
                    "reference_worst": {"index": _index(first, sides.shape), "k": _item(sides.k64, first),
                                        "h": _item(sides.h64, first), "t": _item(sides.t, first)}}


_CLASS_NAMES = ("finite", "NaN", "+inf", "-inf")


def describe_element(index: list[int], k: float, h: float, t: float) -> str:
    """``at [i, j]: k=... h=... t=...``: one element of a verdict, as its text names it."""
    return f"at {index}: k={k:.6g} h={h:.6g} t={t:.6g}"


def _narrower_than_its_compute_dtype(dtype: torch.dtype) -> bool:
    """Note [A reference that overflows]: float16, whose range ends at 65504 where the float32 an op
    computes 16-bit values in reaches 3e38. bfloat16 has float32's range, and float32 and float64
    compute in themselves: an overflow of HF's maths there is the dtype's, and any implementation
    computing as the op does meets it (tests/test_bad_inputs.py's huge values: inf * 0 in float32)."""
    return torch.finfo(dtype).max < torch.finfo(rounding.compute_dtype(dtype)).max


def _nonfinite_problems(placement: _Placement, sides: _Sides) -> list[str]:
    """The non-finite placement's failures, each saying which side is non-finite, with its first
    element."""
    mismatch, reference_nonfinite = placement.mismatch, placement.reference_nonfinite
    k_cls, h_cls = placement.k_cls, placement.h_cls
    kinds = (
        (mismatch & reference_nonfinite,
         "non-finite in k where the float64 truth is finite; HF's reference is non-finite there too: it "
         "overflows or underflows in {dtype}, a declaration problem"),
        (mismatch & ~reference_nonfinite & (h_cls == 0), "non-finite in k where HF is finite"),
        (mismatch & ~reference_nonfinite & (h_cls != 0) & (k_cls == 0), "finite in k where HF is non-finite"),
        (mismatch & ~reference_nonfinite & (h_cls != 0) & (k_cls != 0),
         "non-finite in k and in HF, but not alike (NaN against an infinity, or infinities of opposite signs)"),
    )
    problems = []
    for where, what in kinds:
        n = int(where.sum())
        if not n:
            continue
        first = int(where.flatten().nonzero()[0])
        index = _index(first, sides.shape)
        k_name, h_name = _CLASS_NAMES[int(k_cls.flatten()[first])], _CLASS_NAMES[int(h_cls.flatten()[first])]
        element = describe_element(index, _item(sides.k, first), _item(sides.h, first), _item(sides.t, first))
        problems.append(f"{n} element(s) {what.format(dtype=str(sides.dtype).removeprefix('torch.'))}; first "
                        f"{element} (k {k_name}, HF {h_name})")
    return problems


def _truth_alone_scale(sides: _Sides, element_noise: torch.Tensor | None) -> torch.Tensor:
    """ulp(t_i) + noise_i: the scale k is judged at where HF's reference overflows (noise 0 without
    a noise model)."""
    t = sides.t
    noise = element_noise.to(device=t.device, dtype=torch.float64).expand(t.shape) if element_noise is not None \
        else torch.zeros_like(t)
    return ulps_of(t, sides.dtype) + noise


def _overflow_within_reach(sides: _Sides, element_noise: torch.Tensor | None) -> torch.Tensor:
    """Where a value within ELEMENT_BOUND of the truth at that scale rounds to an infinity in the
    dtype: |t_i| + ELEMENT_BOUND x (ulp(t_i) + noise_i) at least the overflow threshold, the largest
    finite value plus half its spacing."""
    top = torch.tensor(torch.finfo(sides.dtype).max, dtype=torch.float64)
    threshold = top + ulps_of(top, sides.dtype) / 2
    return sides.t.abs() + ELEMENT_BOUND * _truth_alone_scale(sides, element_noise) >= threshold.to(sides.t.device)


def _against_the_truth_alone(sides: _Sides, judged: torch.Tensor, element_noise: torch.Tensor | None,
                             problems: list[str]) -> dict:
    """Note [A reference that overflows]: where HF is non-finite and the truth a number, k's error in
    units of ulp(t_i) + noise_i, at most ELEMENT_BOUND; appends to ``problems``."""
    t = sides.t
    scale = _truth_alone_scale(sides, element_noise)
    scale = torch.where(judged & ~scale.isnan(), scale, 1.0)  # an infinite scale leaves its element unjudged
    e_k = torch.where(judged, (sides.k64 - t).abs() / scale, 0.0)
    exceeding = int((e_k > ELEMENT_BOUND).sum())
    if exceeding:
        flat = int(e_k.flatten().argmax())
        worst = describe_element(_index(flat, sides.shape), _item(sides.k64, flat), _item(sides.h64, flat),
                                 _item(t, flat))
        problems.append(
            f"{exceeding} element(s) where HF's reference is non-finite off the float64 truth by more than "
            f"{ELEMENT_BOUND:g}x the noise model's scale there; worst {worst}, error {_item(e_k, flat):.3g}x its scale")
    # None: k is non-finite at every such element
    return {"reference_element_max": float(_max(e_k)) if bool(judged.any()) else None}


def ulps_of(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per element, the spacing of ``dtype`` at |t| (``ulp_of`` for a whole tensor, as float64), past
    the dtype's range too (oracle/noise/rounding.py)."""
    return rounding.spacing(t, dtype, saturate=False)


def _queue_element_and_distribution(q: Readback, errors: _Errors, element_noise: torch.Tensor,
                                    rooms: tuple[torch.Tensor | None, ...]) -> None:
    """Note [The per-element judgement] and Note [The distribution judgement]: their scalars, queued
    on ``q``. ``rooms``: per element, what else moves a typical error (a long sum's other orders, a
    granted approximation); each may be None."""
    sides, finite = errors.sides, errors.finite
    ulp = ulps_of(sides.t, sides.dtype)
    scale = ulp + element_noise
    # judged elements only (never divide by 0); an infinite scale leaves its element unjudged
    scale = torch.where(finite & ~scale.isnan(), scale, 1.0)
    e_k, e_h = errors.k_err / scale, errors.h_err / scale
    e_r = errors.r_err / scale if errors.r_err is not None else e_h
    q["element_max"], q["hf_element_max"] = _max(e_k), _max(e_h)
    q["element_failures"] = (e_k > ELEMENT_BOUND).sum()
    if sides.t.numel():
        _queue_element(q, "element_worst", e_k.flatten().argmax(), k=sides.k64, h=sides.h64, t=sides.t, e=e_k,
                       scale=scale, ulp=ulp)
    _queue_means(q, errors, scale, (e_k, e_h, e_r), rooms)
    q["over_1ulp k"] = ((errors.k_err > ulp) & finite).sum()
    q["over_1ulp h"] = ((errors.h_err > ulp) & finite).sum()


def _queue_means(q: Readback, errors: _Errors, scale: torch.Tensor, scaled: tuple[torch.Tensor, ...],
                 rooms: tuple[torch.Tensor | None, ...]) -> None:
    """Note [The distribution judgement]: the mean errors of k, h and r (``scaled``, in units of each
    element's scale), the room beyond HF's and HF's two spreads, queued on ``q``."""
    t, finite, n_finite = errors.sides.t, errors.finite, errors.n_finite
    n_safe = n_finite.clamp_min(1)
    means = {side: e.sum() / n_safe for side, e in zip("khr", scaled)}
    for side, mean in means.items():
        q[f"mean {side}"] = mean
    # One more rounding in the compute dtype moves an element by up to u_c |t|: how much a valid
    # formula with EXTRA_ROUNDINGS more operations than HF's may add to the mean (negligible in 16-bit).
    u_c = rounding.unit_roundoff(rounding.accumulator(errors.sides.dtype))
    extra = EXTRA_ROUNDINGS * (torch.where(finite, u_c * t.abs() / scale, 0.0).sum() / n_safe)
    for room in rooms:  # a long sum's other orders, and a granted approximation, move it
        if room is not None:
            room = room.to(device=t.device, dtype=torch.float64).expand(t.shape)
            extra = extra + torch.where(finite & torch.isfinite(room), room / scale, 0.0).sum() / n_safe
    q["mean extra"] = extra
    _, e_h, e_r = scaled
    q["sd h"], q["sd r"] = _sample_sd(e_h, means["h"], finite, n_finite), _sample_sd(e_r, means["r"], finite, n_finite)


def _conclude_element(v: dict, n: int, shape: tuple[int, ...], problems: list[str]) -> dict:
    """Note [The per-element judgement] from the read scalars (``n`` judged elements); appends to
    ``problems``."""
    exceeding = int(v["element_failures"])
    out = {"element_bound": ELEMENT_BOUND, "element_max": v["element_max"], "hf_element_max": v["hf_element_max"],
           "element_failures": exceeding}
    if n:
        out["element_worst"] = _read_element(v, "element_worst", shape, "k", "h", "t", "e", "scale", "ulp")
    if exceeding:
        w = out["element_worst"]
        problems.append(
            f"{exceeding} element(s) ({exceeding / max(1, n):.2%}) off by more than {ELEMENT_BOUND:g}x what HF's "
            f"maths can do there; worst at {w['index']}: k={w['k']:.6g} h={w['h']:.6g} t={w['t']:.6g}, error "
            f"{w['e']:.3g}x its scale ({abs(w['k'] - w['t']) / w['ulp']:.3g} ULPs of its own value)")
    return out


def _conclude_distribution(v: dict, n: int, problems: list[str]) -> dict:
    """Note [The distribution judgement] from the read scalars (``n`` judged elements); appends to
    ``problems``."""
    mean_k, mean_h, mean_r = (v[f"mean {side}"] if n else 0.0 for side in "khr")
    # The sampling noise of a mean over n elements. An implementation as accurate as HF may land
    # anywhere within an element's scale; spread evenly, that is an sd of 1/sqrt(12) in these units,
    # the floor where HF's own errors happen to agree (one element, or HF exact by luck).
    spread = max(v["sd h"], v["sd r"], ONE_ROUNDING_SD)
    mean_bound = (max(mean_h, mean_r) + abs(mean_h - mean_r) + (v["mean extra"] if n else 0.0)
                  + SAMPLING_SDS * spread / math.sqrt(max(1, n)))
    over_k, over_h = v["over_1ulp k"] / max(1, n), v["over_1ulp h"] / max(1, n)
    if mean_k > mean_bound:
        problems.append(
            f"typical error {mean_k:.3g} (mean over {n} elements, in units of each element's scale) exceeds "
            f"{mean_bound:.3g}: HF's {mean_h:.3g}, its other valid order's {mean_r:.3g}; precision lost across "
            f"the tensor ({over_k:.1%} of elements more than 1 ULP off, HF {over_h:.1%})")
    return {"mean_error": mean_k, "hf_mean_error": mean_h, "reordered_mean_error": mean_r,
            "mean_bound": mean_bound, "over_1ulp": over_k, "hf_over_1ulp": over_h}


def _queue_spread(q: Readback, errors: _Errors, spread: Spread) -> None:
    """Note [The spread judgement]: its scalars, queued on ``q``."""
    t = errors.sides.t
    ulp = ulps_of(t, errors.sides.dtype)
    variance = spread.sd.to(device=t.device, dtype=torch.float64).expand(t.shape).square() + ulp.square() / 12
    judged = errors.finite & torch.isfinite(variance) & (variance > 0)
    n_judged = judged.sum()
    variance = torch.where(judged, variance, 1.0)

    def z2(err):
        return torch.where(judged, err.square() / variance, 0.0)

    z_k, z_h = z2(errors.k_err), z2(errors.h_err)
    z_r = z2(errors.r_err) if errors.r_err is not None else z_h
    means = {side: z.sum() / n_judged.clamp_min(1) for side, z in (("k", z_k), ("h", z_h), ("r", z_r))}
    q["spread n"] = n_judged
    for side, mean in means.items():
        q[f"spread {side}"] = mean
    q["spread sd h"] = _sample_sd(z_h, means["h"], judged, n_judged)
    q["spread sd r"] = _sample_sd(z_r, means["r"], judged, n_judged)


def _conclude_spread(v: dict, spread: Spread, problems: list[str]) -> dict:
    """Note [The spread judgement] from the read scalars; appends to ``problems``. Nothing where the
    sums give too few independent draws."""
    n = int(v["spread n"])
    draws = min(n, int(spread.terms))
    if draws < SPREAD_MIN_DRAWS:
        return {}
    mean_k, mean_h, mean_r = (v[f"spread {side}"] for side in "khr")
    spread_sd = max(v["spread sd h"], v["spread sd r"], math.sqrt(2))
    bound = max(mean_h, mean_r, 1.0) + SAMPLING_SDS * spread_sd / math.sqrt(draws)
    if mean_k > bound:
        problems.append(
            f"error spread {mean_k:.3g} (mean squared error over {n} sums of {spread.terms} terms, in units of "
            f"the variance a valid evaluation has there) exceeds {bound:.3g}: HF's {mean_h:.3g}, its other valid "
            f"order's {mean_r:.3g}; a long sum lost precision (partial sums rounded to a narrower dtype?)")
    return {"spread": mean_k, "hf_spread": mean_h, "reordered_spread": mean_r, "spread_bound": bound}


def _sample_sd(x: torch.Tensor, mean: torch.Tensor, judged: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The sample standard deviation of the ``n`` judged elements of ``x`` around ``mean`` (0 for
    fewer than two), on the device."""
    sd = torch.where(judged, x - mean, 0.0).square().sum().div((n - 1).clamp_min(1)).sqrt()
    return torch.where(n > 1, sd, 0.0)


def _max(x: torch.Tensor) -> torch.Tensor:
    """The maximum as a device scalar (0 for an empty tensor)."""
    return x.max() if x.numel() else x.new_zeros((), dtype=torch.float64)


def _judged_quantile(x: torch.Tensor, n: int, q: float) -> float:
    """The q-quantile of the ``n`` judged elements of ``x``, the others being below every judged one
    (ULP distances are >= 0, the unjudged -1): the rank among the judged counts from the end."""
    if not n:
        return 0.0
    k = x.numel() - n + max(1, math.ceil(q * n))
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
    return 2.0 * math.sqrt(max(1, n_terms)) * rounding.unit_roundoff(accumulator) * float(sum_of_abs_terms.max())
