"""libdevice under Triton's CPU interpreter: every function of ``triton.language.extra.libdevice``
computed at its operand's dtype, or refused by name with the reason.

Note [libdevice under the interpreter]
    On a GPU, ``triton.language.extra.libdevice`` is a module of empty stubs that the compiler maps
    to the backend's module (``triton.language.extra.cuda.libdevice``), whose functions choose a
    symbol by the operands' dtypes (``tanh`` on fp32 is ``__nv_tanhf``) and lower to an external
    call. The interpreter does neither: a stub returns None (``'NoneType' object has no attribute
    'dtype'``) and the external call raises NotImplementedError. ``install`` does what the compiler
    does, on every launch and device-function call (Triton's ``_patch_lang``, whose patches are
    undone after the launch): each libdevice function the kernel can reach, through either module
    (``libdevice.tanh``, ``tl.extra.cuda.libdevice.tanh``) or bound to a name in its module
    (``from triton.language.extra.libdevice import tanh``), becomes the CUDA module's function
    called with the interpreter's semantic, so the dtype dispatch, broadcasting and the refusal of
    an unsupported dtype are Triton's own; the external call is then computed here by symbol
    (``SYMBOLS``).

    Accuracy: an fp32 function is evaluated in float64 (numpy, or torch / Python's math where
    numpy has none) and rounded once to fp32, within 0.5 ULP plus 2^-29 ULP, never worse than
    libdevice's documented bound (1-4 ULP; the ``fast_`` approximations far looser). An fp64
    function uses numpy / torch / math at float64 (glibc and Cephes: about 1 ULP, the bounds libdevice
    documents for most), or mpmath at 40 digits where those lose digits (the Bessel functions near
    their zeros, erfcx, normcdf's lower tail, cbrt; and jn, yn, which they lack). Operations with a rounding mode in their name (``add_rz``, ``fma_ru``,
    ``float2int_rd``, ``ll2float_rz``...) are computed exactly in rationals and rounded in that
    mode. Conversions to integers saturate as the GPU's ``cvt`` does (NaN to 0). ``REFUSED`` lists
    the functions that are not computed here, each with the reason; calling one raises
    ``InterpreterRefusal`` naming it.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from oracle.interpreter.refusal import InterpreterRefusal, current_kernel

REFUSED: dict[str, str] = {
    "fast_tanhf": "it exists only in the AMD (HIP) libdevice; on an NVIDIA GPU a kernel calling it does not compile",
    "rcp64h": "its result is the GPU's approximate reciprocal of the high 32 bits (MUFU.RCP64H), which has "
              "no bit-exact specification to compute it by",
}

_I32, _U32, _I64, _U64 = np.int32, np.uint32, np.int64, np.uint64


# --- helpers ------------------------------------------------------------------------------------------


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def _unary(f, out):
    """f evaluated in float64, rounded once to ``out``."""
    return lambda x: f(_f64(x)).astype(out)


def _binary(f, out):
    return lambda x, y: f(_f64(x), _f64(y)).astype(out)


def _torch64(name):
    op = getattr(torch.special, name, None) or getattr(torch, name)
    return lambda x: op(torch.from_numpy(np.array(x, dtype=np.float64))).numpy()


def _elementwise64(f):
    """A Python float function over every element, in float64 (math.gamma raises at its poles and on
    overflow: IEEE's values there)."""
    def safe(v):
        try:
            return f(v)
        except (ValueError, OverflowError):
            if v == 0:
                return math.copysign(math.inf, v)
            return math.inf if v > 0 else math.nan  # negative integers and -inf: NaN
    vec = np.vectorize(safe, otypes=[np.float64])
    return lambda x: vec(_f64(x)) if np.size(x) else _f64(x)


def _mp(f, dps=40):
    """f in mpmath at ``dps`` digits over every element (float64 results; NaN where it has none): for
    the functions whose numpy/torch float64 versions lose digits (Bessel functions near their zeros,
    erfcx, normcdf in the lower tail). mpmath ships with torch (through sympy)."""
    import mpmath

    def one(*vals):
        try:
            with mpmath.workdps(dps):
                out = f(*[mpmath.mpf(float(v)) if isinstance(v, (float, np.floating)) else int(v) for v in vals])
                if isinstance(out, mpmath.mpc):
                    return math.nan if out.imag else float(out.real)
                return float(out)
        except (ValueError, ZeroDivisionError, OverflowError):
            return math.nan
    vec = np.frompyfunc(one, f.__code__.co_argcount if hasattr(f, "__code__") else 1, 1)
    return lambda *xs: np.asarray(vec(*xs), dtype=np.float64) if np.size(xs[0]) else _f64(xs[0])


def _bessel(kind, order=None):
    import mpmath

    fn = mpmath.besselj if kind == "j" else mpmath.bessely if kind == "y" else mpmath.besseli

    def at_zero(n):
        return (1.0 if n == 0 else 0.0) if kind in "ji" else -math.inf

    if order is None:
        def f(n, x):
            if x == 0:
                return mpmath.mpf(at_zero(int(n)))
            if kind == "y" and x < 0:
                return mpmath.mpf("nan")
            return fn(int(n), x)
        vec = _mp(f)
        return lambda n, x: vec(np.asarray(n), _f64(x))

    def g(x):
        if x == 0:
            return mpmath.mpf(at_zero(order))
        if kind == "y" and x < 0:
            return mpmath.mpf("nan")
        return fn(order, x)
    return _mp(g)


def _sinpi(x):
    r = np.fmod(x, 2.0)  # exact, and so are the reflections below
    r = np.where(np.abs(r) > 1, r - np.copysign(2.0, r), r)
    t = np.where(np.abs(r) > 0.5, np.copysign(1.0 - np.abs(r), r), r)
    return np.where(np.isinf(x), np.nan, np.sin(np.pi * t))


def _cospi(x):
    r = np.fmod(np.abs(x), 2.0)
    r = np.where(r > 1, 2.0 - r, r)  # [0, 1]; near the zero at 1/2, a sine of the exact 1/2 - r
    out = np.where(r <= 0.25, np.cos(np.pi * r), np.sin(np.pi * (0.5 - r)))
    return np.where(np.isinf(x), np.nan, np.where(r == 0.5, 0.0, out))


def _round_half_away(x):
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _logb(x):
    _, e = np.frexp(x)
    out = (e - 1).astype(np.float64)
    out = np.where(x == 0, -np.inf, out)
    return np.where(np.isinf(x), np.inf, np.where(np.isnan(x), np.nan, out))


def _ilogb(x):
    _, e = np.frexp(np.where(np.isfinite(x), x, 1.0))
    out = (e - 1).astype(np.int64)
    out = np.where((x == 0) | np.isnan(x), np.iinfo(np.int32).min, out)
    return np.where(np.isinf(x), np.iinfo(np.int32).max, out).astype(_I32)


def _flag(test):
    return lambda x: test(x).astype(_I32)


def _erfcinv(x):
    return -_torch64("ndtri")(_f64(x) / 2.0) / math.sqrt(2.0)


def _mp_cbrt(x):
    import mpmath

    return mpmath.sign(x) * mpmath.cbrt(abs(x))


def _mp_rcbrt(x):
    import mpmath

    return mpmath.sign(x) / mpmath.cbrt(abs(x)) if x else mpmath.mpf(math.copysign(math.inf, x))


def _mp_erfcx(x):
    import mpmath

    return mpmath.exp(x * x) * mpmath.erfc(x)


def _mp_ncdf(x):
    import mpmath

    return mpmath.ncdf(x)


def _fdim(x, y):
    d = np.subtract(x, y)
    return np.where(np.isnan(x) | np.isnan(y), np.nan, np.where(x > y, d, 0)).astype(x.dtype)


def _norm(*xs):
    out = np.abs(xs[0])
    for x in xs[1:]:
        out = np.hypot(out, x)
    return out


# --- exact arithmetic in a rounding mode ----------------------------------------------------------------


def _neighbour(c, toward):
    return np.nextafter(c, c.dtype.type(toward))


def _round_rational(q: Fraction, kind, mode: str):
    """The rational q rounded to the float type ``kind`` (np.float32/np.float64) in ``mode``
    (rn: nearest even, rz: toward zero, rd: down, ru: up)."""
    big = np.finfo(kind).max
    try:
        c = kind(float(q))
    except OverflowError:
        c = kind(math.copysign(math.inf, q))
    if np.isinf(c):
        if mode == "rn":
            return c
        up = (q > 0 and mode == "ru") or (q < 0 and mode == "rd")
        return c if up else kind(math.copysign(big, q))
    d = Fraction(float(c)) - q
    if d == 0:
        return c
    if mode == "rn":
        other = _neighbour(c, -math.inf if d > 0 else math.inf)
        if np.isinf(other):
            return c
        e = abs(Fraction(float(other)) - q)
        if e < abs(d) or (e == abs(d) and int(np.array(other).view(_unsigned(kind))) % 2 == 0):
            return other
        return c
    if mode == "rd" and d > 0:
        return _neighbour(c, -math.inf)
    if mode == "ru" and d < 0:
        return _neighbour(c, math.inf)
    if mode == "rz" and abs(Fraction(float(c))) > abs(q):
        return _neighbour(c, 0.0)
    return c


def _unsigned(kind):
    return np.uint32 if kind == np.float32 else np.uint64


def _exact(op, kind, mode):
    """An arithmetic operation on floats of ``kind`` computed exactly, rounded in ``mode``; NaN, inf and
    an exactly-zero result take numpy's round-to-nearest value (its sign of zero, made -0 for a
    sum rounded down, as IEEE says)."""
    exact_op, nearest = op

    def one(*vals):
        vals = [kind(v) for v in vals]
        with np.errstate(all="ignore"):
            near = kind(nearest(*vals))
        if not all(np.isfinite(v) for v in vals) or np.isnan(near):
            return near
        q = exact_op(*[Fraction(float(v)) for v in vals])
        if q is None:
            return near
        if q == 0:
            if mode == "rd" and exact_op in _SUMS and not all(t == 0 and math.copysign(1, t) > 0
                                                              for t in _terms(exact_op, vals)):
                return kind(-0.0)
            return near
        return _round_rational(q, kind, mode)

    vec = np.frompyfunc(one, _ARITY[exact_op], 1)
    return lambda *xs: np.asarray(vec(*np.broadcast_arrays(*xs)), dtype=kind)


def _terms(op, vals):
    """The addends of a sum, as floats with their signs (for the sign of an exact zero)."""
    if op is _q_add:
        return [float(vals[0]), float(vals[1])]
    if op is _q_sub:
        return [float(vals[0]), -float(vals[1])]
    return [float(vals[0]) * float(vals[1]), float(vals[2])]


def _q_add(a, b):
    return a + b


def _q_sub(a, b):
    return a - b


def _q_mul(a, b):
    return a * b


def _q_div(a, b):
    return None if b == 0 else a / b


def _q_fma(a, b, c):
    return a * b + c


def _q_rcp(a):
    return None if a == 0 else 1 / a


def _q_sqrt(a):
    """sqrt(a) to 120 bits or more, plus a sticky half unit when inexact (so it is never a float's value
    or a midpoint between two, and rounds as the exact root does)."""
    if a < 0:
        return None
    k = max(0, (240 - (a.numerator.bit_length() - a.denominator.bit_length())) // 2 + 1)
    scaled = a * 4 ** k
    n = scaled.numerator // scaled.denominator
    r = math.isqrt(n)
    exact = r * r == n and scaled.denominator == 1
    return Fraction(r, 2 ** k) + (0 if exact else Fraction(1, 2 ** (k + 1)))


_SUMS = (_q_add, _q_sub, _q_fma)
_ARITY = {_q_add: 2, _q_sub: 2, _q_mul: 2, _q_div: 2, _q_fma: 3, _q_rcp: 1, _q_sqrt: 1}
_NEAREST = {_q_add: np.add, _q_sub: np.subtract, _q_mul: np.multiply, _q_div: np.divide,
            _q_fma: lambda a, b, c: a * b + c, _q_rcp: lambda a: 1 / a, _q_sqrt: np.sqrt}


def _mode_op(q, kind, mode):
    return _exact((q, _NEAREST[q]), kind, mode)


def _fma_nearest(kind):
    from triton.runtime.interpreter import _interpreter

    native = getattr(_interpreter, "fma_fp32" if kind == np.float32 else "fma_fp64", None)
    if native is not None:
        return lambda a, b, c: native(*np.broadcast_arrays(np.asarray(a, kind), np.asarray(b, kind),
                                                           np.asarray(c, kind)))
    return _mode_op(_q_fma, kind, "rn")


# --- conversions ----------------------------------------------------------------------------------------

_TO_INTEGER = {"rn": np.rint, "rz": np.trunc, "rd": np.floor, "ru": np.ceil}


def _to_int(mode, target, result):
    """Round in ``mode``, saturate to ``target``'s range (NaN to 0) as the GPU's cvt does, and return the
    bits as ``result`` (libdevice declares its unsigned conversions' results signed)."""
    info = np.iinfo(target)
    clamp = np.frompyfunc(lambda v: min(max(int(v), int(info.min)), int(info.max)), 1, 1)

    def convert(x):
        r = _TO_INTEGER[mode](_f64(x))
        r = np.clip(np.where(np.isnan(r), 0.0, r), -2.0 ** 64, 2.0 ** 64)
        out = np.asarray(clamp(r), dtype=target) if r.size else r.astype(target)
        return out.view(result) if np.dtype(target).itemsize == np.dtype(result).itemsize else out.astype(result)
    return convert


def _from_int(kind, mode):
    def convert(x):
        ints = np.asarray(x)
        if mode == "rn":
            return ints.astype(kind)
        one = np.frompyfunc(lambda v: _round_rational(Fraction(int(v)), kind, mode), 1, 1)
        return np.asarray(one(ints), dtype=kind)
    return convert


def _float_to(kind, mode):
    one = np.frompyfunc(lambda v: kind(v) if not np.isfinite(v) or v == 0 else
                        _round_rational(Fraction(float(v)), kind, mode), 1, 1)

    def convert(x):
        x = np.asarray(x, np.float64)
        if mode == "rn" or not x.size:
            return x.astype(kind)
        return np.asarray(one(x), dtype=kind)
    return convert


# --- integer intrinsics ---------------------------------------------------------------------------------


def _clz(bits):
    def f(x):
        u = np.asarray(x).view(_U32 if bits == 32 else _U64).astype(object)
        return np.asarray(np.frompyfunc(lambda v: bits - int(v).bit_length(), 1, 1)(u), dtype=_I32)
    return f


def _popc(bits):
    def f(x):
        u = np.asarray(x).view(_U32 if bits == 32 else _U64)
        return np.asarray(np.frompyfunc(lambda v: bin(int(v)).count("1"), 1, 1)(u), dtype=_I32)
    return f


def _brev(bits):
    def f(x):
        unsigned = _U32 if bits == 32 else _U64
        u = np.asarray(x).view(unsigned)
        rev = np.frompyfunc(lambda v: int(format(int(v), f"0{bits}b")[::-1], 2), 1, 1)(u)
        return np.asarray(rev, dtype=unsigned).view(x.dtype)
    return f


def _ffs(bits):
    def f(x):
        u = np.asarray(x).view(_U32 if bits == 32 else _U64)
        return np.asarray(np.frompyfunc(lambda v: (int(v) & -int(v)).bit_length(), 1, 1)(u), dtype=_I32)
    return f


def _byte_perm(x, y, s):
    def one(a, b, sel):
        data = (int(b) & 0xFFFFFFFF) << 32 | (int(a) & 0xFFFFFFFF)
        out = 0
        for i in range(4):
            k = (int(sel) >> (4 * i)) & 0x7
            out |= ((data >> (8 * k)) & 0xFF) << (8 * i)
        return out
    res = np.frompyfunc(one, 3, 1)(*np.broadcast_arrays(x, y, s))
    return np.asarray(res, dtype=_U32).view(_I32)


def _mulhi(kind, bits):
    mask = (1 << bits) - 1
    one = np.frompyfunc(lambda a, b: ((int(a) * int(b)) >> bits) & mask, 2, 1)

    def f(x, y):
        return np.asarray(one(*np.broadcast_arrays(x, y)), dtype=_U32 if bits == 32 else _U64).view(kind)
    return f


def _mul24(kind):
    def f(x, y):
        def low24(v):
            v = int(v) & 0xFFFFFF
            return v - (1 << 24) if kind == _I32 and v & 0x800000 else v
        one = np.frompyfunc(lambda a, b: (low24(a) * low24(b)) & 0xFFFFFFFF, 2, 1)
        return np.asarray(one(*np.broadcast_arrays(x, y)), dtype=_U32).view(kind)
    return f


def _sad(kind):
    def f(x, y, z):
        one = np.frompyfunc(lambda a, b, c: (abs(int(a) - int(b)) + int(c)) & 0xFFFFFFFF, 3, 1)
        return np.asarray(one(*np.broadcast_arrays(x, y, z)), dtype=_U32).view(kind)
    return f


def _halving(kind, rounding):
    def f(x, y):
        one = np.frompyfunc(lambda a, b: ((int(a) + int(b) + rounding) >> 1) & 0xFFFFFFFF, 2, 1)
        return np.asarray(one(*np.broadcast_arrays(x, y)), dtype=_U32).view(kind)
    return f


def _hilo(hi, lo):
    bits = (np.asarray(hi).astype(_I64).view(_U64) << _U64(32)) | (np.asarray(lo).view(_U32).astype(_U64))
    return bits.view(np.float64)


# --- the table: symbol -> implementation over numpy arrays at the operand dtypes -------------------------


def _float_pair(name, f, *, f32=None, f64=None):
    """__nv_<name>f at fp32 (f in float64, rounded) and __nv_<name> at fp64."""
    return {f"__nv_{name}f": f32 or _unary(f, np.float32), f"__nv_{name}": f64 or (lambda x: f(_f64(x)))}


def _add_unary(t: dict) -> None:
    """Functions of one float: libdevice's maths (at fp32 and fp64), its absolute values, class tests and
    fast variants."""
    unary = {
        "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint, "nearbyint": np.rint,
        "round": _round_half_away, "exp2": np.exp2, "exp": np.exp, "exp10": lambda x: np.power(10.0, x),
        "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
        "sin": np.sin, "cos": np.cos, "tan": np.tan, "sinpi": _sinpi, "cospi": _cospi, "sinh": np.sinh,
        "cosh": np.cosh, "tanh": np.tanh, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
        "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "cbrt": _mp(_mp_cbrt),
        "rcbrt": _mp(_mp_rcbrt), "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
        "erf": _torch64("erf"), "erfc": _torch64("erfc"), "erfinv": _torch64("erfinv"),
        "erfcinv": _erfcinv, "erfcx": _mp(_mp_erfcx), "normcdf": _mp(_mp_ncdf),
        "normcdfinv": _torch64("ndtri"), "lgamma": _torch64("lgamma"), "tgamma": _elementwise64(math.gamma),
        "j0": _bessel("j", 0), "j1": _bessel("j", 1), "y0": _bessel("y", 0), "y1": _bessel("y", 1),
        "cyl_bessel_i0": _bessel("i", 0), "cyl_bessel_i1": _bessel("i", 1),
        "logb": _logb,
    }
    for name, f in unary.items():
        t.update(_float_pair(name, f))
    t["__nv_fabsf"] = t["__nv_fabs"] = np.abs
    t["__nv_abs"] = t["__nv_llabs"] = np.abs
    t["__nv_saturatef"] = lambda x: np.where(np.isnan(x), 0, np.clip(x, 0, 1)).astype(np.float32)
    for sym, f in {"__nv_ilogbf": _ilogb, "__nv_ilogb": _ilogb}.items():
        t[sym] = f
    t.update({"__nv_isnanf": _flag(np.isnan), "__nv_isnand": _flag(np.isnan), "__nv_isinff": _flag(np.isinf),
              "__nv_isinfd": _flag(np.isinf), "__nv_signbitf": _flag(np.signbit),
              "__nv_signbitd": _flag(np.signbit), "__nv_finitef": _flag(np.isfinite),
              "__nv_isfinited": _flag(np.isfinite)})
    for fast, exact in {"sinf": "sinf", "cosf": "cosf", "log2f": "log2f", "logf": "logf", "expf": "expf",
                        "tanf": "tanf", "exp10f": "exp10f", "log10f": "log10f"}.items():
        t[f"__nv_fast_{fast}"] = t[f"__nv_{exact}"]


def _add_binary(t: dict) -> None:
    """Functions of several floats: libdevice's maths of two operands, integer powers and exponents,
    Bessel functions of any order, norms and fused multiply-adds."""
    binary = {"atan2": np.arctan2, "hypot": np.hypot, "rhypot": lambda x, y: 1.0 / np.hypot(x, y),
              "pow": np.power, "remainder": np.vectorize(math.remainder, otypes=[np.float64])}
    for name, f in binary.items():
        t[f"__nv_{name}f"] = _binary(f, np.float32)
        t[f"__nv_{name}"] = (lambda f: lambda x, y: f(_f64(x), _f64(y)))(f)
    t["__nv_fast_powf"] = t["__nv_powf"]
    t["__nv_powif"] = lambda x, n: np.power(_f64(x), _f64(n)).astype(np.float32)
    t["__nv_powi"] = lambda x, n: np.power(_f64(x), _f64(n))
    for sym, kind in {"f": np.float32, "": np.float64}.items():
        t[f"__nv_copysign{sym}"] = (lambda k: lambda x, y: np.copysign(x, y).astype(k))(kind)
        t[f"__nv_nextafter{sym}"] = (lambda k: lambda x, y: np.nextafter(x.astype(k), y.astype(k)))(kind)
        t[f"__nv_fmod{sym}"] = (lambda k: lambda x, y: np.fmod(x.astype(k), y.astype(k)))(kind)
        t[f"__nv_fdim{sym}"] = _fdim
        t[f"__nv_ldexp{sym}"] = t[f"__nv_scalbn{sym}"] = (lambda k: lambda x, n: np.ldexp(x.astype(k), n))(kind)
    t["__nv_jnf"] = lambda n, x: _bessel("j")(n, x).astype(np.float32)
    t["__nv_jn"] = _bessel("j")
    t["__nv_ynf"] = lambda n, x: _bessel("y")(n, x).astype(np.float32)
    t["__nv_yn"] = _bessel("y")
    t["__nv_fast_fdividef"] = lambda x, y: np.divide(x, y).astype(np.float32)
    t["__nv_norm3df"] = t["__nv_norm4df"] = lambda *xs: _norm(*map(_f64, xs)).astype(np.float32)
    t["__nv_rnorm3df"] = t["__nv_rnorm4df"] = lambda *xs: (1.0 / _norm(*map(_f64, xs))).astype(np.float32)
    t["__nv_norm3d"] = t["__nv_norm4d"] = lambda *xs: _norm(*map(_f64, xs))
    t["__nv_rnorm3d"] = t["__nv_rnorm4d"] = lambda *xs: 1.0 / _norm(*map(_f64, xs))
    t["__nv_fmaf"] = t["__nv_fmaf_rn"] = _fma_nearest(np.float32)
    t["__nv_fma"] = t["__nv_fma_rn"] = _fma_nearest(np.float64)
    t["__nv_frsqrt_rn"] = _unary(lambda x: 1.0 / np.sqrt(x), np.float32)


def _add_rounding_modes(t: dict) -> None:
    """Arithmetic and conversions with a rounding mode in their name (rn, rz, rd, ru)."""
    # operations with a rounding mode in their name: exact in rationals, then rounded in that mode
    ops = {"add": _q_add, "sub": _q_sub, "mul": _q_mul, "div": _q_div, "rcp": _q_rcp, "sqrt": _q_sqrt}
    for mode in ("rn", "rz", "rd", "ru"):
        for op, q in ops.items():
            t[f"__nv_f{op}_{mode}"] = _mode_op(q, np.float32, mode)
            t[f"__nv_d{op}_{mode}"] = _mode_op(q, np.float64, mode)
        if mode != "rn":
            t[f"__nv_fmaf_{mode}"] = _mode_op(_q_fma, np.float32, mode)
            t[f"__nv_fma_{mode}"] = _mode_op(_q_fma, np.float64, mode)
        t[f"__nv_double2float_{mode}"] = _float_to(np.float32, mode)
        for src in ("float", "double"):
            t[f"__nv_{src}2int_{mode}"] = _to_int(mode, _I32, _I32)
            t[f"__nv_{src}2uint_{mode}"] = _to_int(mode, _U32, _I32)
            t[f"__nv_{src}2ll_{mode}"] = _to_int(mode, _I64, _I64)
            t[f"__nv_{src}2ull_{mode}"] = _to_int(mode, _U64, _I64)
        for src in ("int", "uint", "ll", "ull"):
            t[f"__nv_{src}2float_{mode}"] = _from_int(np.float32, mode)
        for src in ("ll", "ull"):
            t[f"__nv_{src}2double_{mode}"] = _from_int(np.float64, mode)
    t["__nv_int2double_rn"] = t["__nv_uint2double_rn"] = _from_int(np.float64, "rn")
    t["__nv_llrintf"] = t["__nv_llrint"] = _to_int("rn", _I64, _I64)
    t["__nv_llroundf"] = t["__nv_llround"] = lambda x: _to_int("rz", _I64, _I64)(_round_half_away(_f64(x)))


def _add_bits(t: dict) -> None:
    """Reinterpretations of bits, and the integer intrinsics (bit counts, high products, averages)."""
    t["__nv_hiloint2double"] = _hilo
    t["__nv_double2loint"] = lambda x: np.asarray(x, np.float64).view(_U64).astype(_U32).view(_I32)
    t["__nv_double2hiint"] = lambda x: (np.asarray(x, np.float64).view(_U64) >> _U64(32)).astype(_U32).view(_I32)
    t["__nv_int_as_float"] = t["__nv_uint_as_float"] = lambda x: np.asarray(x).view(np.float32)
    t["__nv_float_as_int"] = t["__nv_float_as_uint"] = lambda x: np.asarray(x, np.float32).view(_I32)
    t["__nv_longlong_as_double"] = lambda x: np.asarray(x).view(np.float64)
    t["__nv_double_as_longlong"] = lambda x: np.asarray(x, np.float64).view(_I64)
    t.update({"__nv_clz": _clz(32), "__nv_clzll": _clz(64), "__nv_popc": _popc(32), "__nv_popcll": _popc(64),
              "__nv_brev": _brev(32), "__nv_brevll": _brev(64), "__nv_ffs": _ffs(32), "__nv_ffsll": _ffs(64),
              "__nv_byte_perm": _byte_perm, "__nv_mulhi": _mulhi(_I32, 32), "__nv_umulhi": _mulhi(_U32, 32),
              "__nv_mul64hi": _mulhi(_I64, 64), "__nv_umul64hi": _mulhi(_U64, 64), "__nv_mul24": _mul24(_I32),
              "__nv_umul24": _mul24(_U32), "__nv_sad": _sad(_I32), "__nv_usad": _sad(_U32),
              "__nv_hadd": _halving(_I32, 0), "__nv_uhadd": _halving(_U32, 0), "__nv_rhadd": _halving(_I32, 1),
              "__nv_urhadd": _halving(_U32, 1)})


def _build() -> dict:
    """symbol -> implementation over numpy arrays at the operand dtypes, family by family."""
    t: dict = {}
    for add in (_add_unary, _add_binary, _add_rounding_modes, _add_bits):
        add(t)
    return t


SYMBOLS: dict = _build()


# --- the interpreter's side: the external call, and the functions a kernel reaches ------------------------


def extern_elementwise(builder, lib_name, lib_path, symbol, arg_list, ret_type, is_pure):
    """InterpreterBuilder.create_extern_elementwise: the libdevice symbol computed here."""
    from triton.runtime.interpreter import TensorHandle, _get_np_dtype

    impl = SYMBOLS.get(symbol)
    if impl is None:
        raise InterpreterRefusal(f"kernel {current_kernel()} calls {symbol}, which the CPU interpreter does not "
                                 f"compute (oracle/interpreter/libdevice.py has no implementation for it)")
    shape = np.broadcast_shapes(*[np.shape(a.data) for a in arg_list])
    args = [np.broadcast_to(a.data, shape) for a in arg_list]
    with np.errstate(all="ignore"):
        out = np.asarray(impl(*args))
    scalar = ret_type.scalar
    return TensorHandle(np.ascontiguousarray(out.astype(_get_np_dtype(scalar), copy=False)).reshape(shape), scalar)


def _refusal(name):
    def refused(*args, **kwargs):
        raise InterpreterRefusal(f"kernel {current_kernel()} calls libdevice.{name}, which the CPU interpreter "
                                 f"refuses: {REFUSED[name]}")
    refused.__name__ = name
    return refused


def interpreted_function(name: str, cuda_module, semantic):
    """What ``libdevice.<name>`` is inside an interpreted kernel."""
    if name in REFUSED:
        return _refusal(name)
    target = getattr(cuda_module, name)

    def call(*args, **kwargs):
        kwargs.pop("_semantic", None)
        try:
            return target(*args, _semantic=semantic, **kwargs)
        except KeyError as exc:  # extern_elementwise's dtype table has no entry for these operands
            dtypes = ", ".join(str(getattr(a, "dtype", type(a).__name__)) for a in args)
            raise TypeError(f"libdevice.{name} has no version for operands of dtype ({dtypes}); on a GPU the "
                            f"kernel {current_kernel()} fails to compile too") from exc
    call.__name__ = name
    call._oracle_libdevice = name
    return call


def public_names() -> list[str]:
    """Every public function of ``triton.language.extra.libdevice`` in the loaded triton."""
    import inspect

    from triton.language.extra import libdevice

    return sorted(n for n, f in vars(libdevice).items() if inspect.isfunction(f) and not n.startswith("_"))
