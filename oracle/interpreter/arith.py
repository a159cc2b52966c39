"""16-bit floating-point arithmetic under Triton's CPU interpreter, as a GPU computes it.

Note [16-bit arithmetic under the interpreter]
    The interpreter keeps bf16 values as their raw uint16 bits and hands those bits to numpy, so
    ``a * b``, ``a + b``, ``-a``, ``a < b``, ``tl.maximum``, ``tl.fma``, ``tl.dot``, ``tl.sum``,
    ``tl.max`` and ``tl.cumsum`` on bf16 values compute on integers: NaN, 1e38, wrong signs. A GPU
    computes each such operation in fp32 (or natively in bf16, which rounds the same) and rounds the
    result to the storage type, to nearest even. ``install`` corrects the interpreter's builder and
    reductions so that every operation on bf16 values does exactly that:

    - elementwise (+ - * / %, negation, comparisons, min/max, clamp): both operands widened exactly
      to fp32, the operation in fp32, the result rounded to bf16 (for + - * / the fp32 result then
      rounded to bf16 is the correctly rounded bf16 result: fp32 has more than twice bf16's precision);
    - fma: the exact product and one sum in float64, made round-to-odd, then rounded to the 16-bit
      type: one rounding, as the GPU's fused operation (fp16 too, which the interpreter rounded twice);
    - tl.dot: widened to fp32 and accumulated in fp32, as tensor cores do;
    - tl.sum: Triton sums in the input's dtype (``_pick_sum_dtype`` keeps bf16 and fp16), so every
      partial sum is rounded to it. A GPU adds a thread's own elements in order, then combines across
      lanes and warps by halving; the interpreter here combines by halving (the GPU's shuffle tree),
      rounding each partial sum to the 16-bit type. The GPU's per-thread order depends on its layout,
      so its bits can differ by a few units in the last place; the accuracy is the GPU's in kind, and
      a kernel that accumulates in 16 bits is judged with that loss (fp16 too: numpy summed it
      in fp32);
    - tl.max / tl.min / argmax / argmin: on the widened values (exact);
    - tl.cumsum / tl.cumprod: in order, rounding each partial result to the 16-bit type;
    - atomics on bf16 values, and arithmetic on fp8 values (also kept as raw bits), are refused with
      ``InterpreterRefusal`` naming the kernel: the interpreter cannot compute them as a GPU does.
    fp16 elementwise arithmetic needed no correction: numpy's float16 operations compute in fp32 and
    round to nearest even, as a GPU does. ``probe`` checks all of it against torch.
"""

from __future__ import annotations

import numpy as np
import torch

from oracle.interpreter.refusal import InterpreterRefusal, current_kernel


def widen(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) to the fp32 values they encode (exact)."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def narrow(values) -> np.ndarray:
    """fp32 (or fp64) values rounded to nearest even bf16, as uint16 bits."""
    t = torch.from_numpy(np.ascontiguousarray(values))
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).reshape(np.shape(values))


def _is(dtype, name):
    return getattr(getattr(dtype, "scalar", dtype), "name", None) == name


def _is_fp8(dtype):
    scalar = getattr(dtype, "scalar", dtype)
    return getattr(scalar, "is_fp8", lambda: False)()


def _binary_op(original):
    from triton.runtime.interpreter import TensorHandle

    def binary_op(self, lhs, rhs, op):
        if _is_fp8(lhs.dtype) or _is_fp8(rhs.dtype):
            raise InterpreterRefusal(f"kernel {current_kernel()} does arithmetic on {lhs.dtype.scalar} values, which "
                                     f"the CPU interpreter keeps as raw bits and cannot compute as a GPU does")
        if not (_is(lhs.dtype, "bf16") or _is(rhs.dtype, "bf16")):
            return original(self, lhs, rhs, op)
        a = widen(lhs.data) if _is(lhs.dtype, "bf16") else lhs.data
        b = widen(rhs.data) if _is(rhs.dtype, "bf16") else rhs.data
        with np.errstate(all="ignore"):
            out = op(a, b)
        if out.dtype.kind == "f":
            return TensorHandle(narrow(out.astype(np.float32)), lhs.dtype.scalar)
        return TensorHandle(out, _int1())  # a comparison (the interpreter labels it bf16, and a cast then misreads it)

    binary_op._oracle_original = original
    return binary_op


def _unary_op(original):
    from triton.runtime.interpreter import TensorHandle

    def unary_op(self, arg, op):
        if not _is(arg.dtype, "bf16"):
            return original(self, arg, op)
        with np.errstate(all="ignore"):
            out = op(widen(arg.data))
        return TensorHandle(narrow(out.astype(np.float32)), arg.dtype.scalar)

    unary_op._oracle_original = original
    return unary_op


def _fused(x, y, z, out_dtype):
    """x*y+z rounded once: exact product in float64 (16-bit significands), one float64 sum made
    round-to-odd from its exact error (TwoSum), then rounded to nearest even at ``out_dtype``."""
    p = x.astype(np.float64) * y.astype(np.float64)
    c = z.astype(np.float64)
    s = p + c
    bp = s - c
    err = (p - bp) + (c - (s - bp))
    bits = s.view(np.uint64)
    inexact = np.isfinite(s) & (err != 0) & ((bits & np.uint64(1)) == 0)
    s = np.where(inexact, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    if out_dtype == "bf16":
        return narrow(s)
    return s.astype(np.float16)


def _fma(original):
    from triton.runtime.interpreter import TensorHandle

    def create_fma(self, x, y, z):
        if _is(z.dtype, "bf16"):
            args = np.broadcast_arrays(widen(x.data), widen(y.data), widen(z.data))
            with np.errstate(all="ignore"):
                return TensorHandle(_fused(*args, "bf16"), z.dtype.scalar)
        if _is(z.dtype, "fp16"):
            args = np.broadcast_arrays(x.data, y.data, z.data)
            with np.errstate(all="ignore"):
                return TensorHandle(_fused(*args, "fp16"), z.dtype.scalar)
        return original(self, x, y, z)

    create_fma._oracle_original = original
    return create_fma


def _clampf(original):
    from triton.runtime.interpreter import TensorHandle

    def create_clampf(self, arg, lo, hi, propagate_nans):
        if not _is(arg.dtype, "bf16"):
            return original(self, arg, lo, hi, propagate_nans)
        wide = [TensorHandle(widen(h.data), _fp32()) for h in (arg, lo, hi)]
        out = original(self, *wide, propagate_nans)
        return TensorHandle(narrow(out.data.astype(np.float32)), arg.dtype.scalar)

    create_clampf._oracle_original = original
    return create_clampf


def _int1():
    import triton.language as tl

    return tl.int1


def _fp32():
    import triton.language as tl

    return tl.float32


def _dot(original):
    from triton.runtime.interpreter import TensorHandle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if not (_is(a.dtype, "bf16") or _is(b.dtype, "bf16") or _is(d.dtype, "bf16")):
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        wide = [TensorHandle(widen(h.data), _fp32()) if _is(h.dtype, "bf16") else h for h in (a, b, d)]
        out = original(self, *wide, input_precision, max_num_imprecise_acc)
        if _is(d.dtype, "bf16"):
            return TensorHandle(narrow(out.data.astype(np.float32)), d.dtype.scalar)
        return out

    create_dot._oracle_original = original
    return create_dot


def _atomic_rmw(original):
    def create_atomic_rmw(self, rmw_op, ptr, val, mask, sem, scope):
        if _is(val.dtype, "bf16") or _is_fp8(val.dtype):
            raise InterpreterRefusal(f"kernel {current_kernel()} does an atomic {rmw_op} on {val.dtype.scalar} "
                                     f"values, which the CPU interpreter's atomics compute on the raw bits")
        return original(self, rmw_op, ptr, val, mask, sem, scope)

    create_atomic_rmw._oracle_original = original
    return create_atomic_rmw


# --- reductions and scans -------------------------------------------------------------------------------


def _to16(values, name):
    return narrow(values) if name == "bf16" else values.astype(np.float16)


def _from16(data, name):
    return widen(data) if name == "bf16" else np.asarray(data).astype(np.float32)


def tree_sum(data, name, axis, keep_dims):
    """Sum of 16-bit values along ``axis`` (all when None) by halving, each partial sum rounded to the
    16-bit type ``name`` ('bf16' or 'fp16'); returns storage values (bits for bf16)."""
    values = _from16(data, name)
    if axis is None:
        values = values.reshape(-1)
        axis_ = 0
    else:
        axis_ = axis % values.ndim
    moved = np.moveaxis(values, axis_, -1)
    n = moved.shape[-1]
    width = 1 << max(0, (n - 1).bit_length())
    pad = np.full(moved.shape[:-1] + (width - n,), -0.0, dtype=np.float32)  # x + -0 == x, for every x
    x = np.concatenate([moved, pad], axis=-1)
    with np.errstate(all="ignore"):
        while x.shape[-1] > 1:
            half = x.shape[-1] // 2
            x = _from16(_to16(x[..., :half] + x[..., half:], name), name)
    total = x[..., 0]
    if keep_dims:
        if axis is None:
            total = total.reshape((1,) * np.ndim(data))
        else:
            total = np.expand_dims(total, axis_)
    return _to16(np.asarray(total, dtype=np.float32), name)


def _reduce_sum(original):
    def sum_(self, input):
        name = input.dtype.scalar.name
        if name not in ("bf16", "fp16"):
            return original(self, input)
        return self.to_tensor(tree_sum(input.handle.data, name, self.axis, self.keep_dims), input.dtype)

    sum_._oracle_original = original
    return sum_


def _min_max(original):
    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        tensor = input[0] if isinstance(input, tuple) else input
        if not _is(tensor.dtype, "bf16"):
            return original(self, input, val_reduce_op, idx_reduce_op)
        import triton.language as tl

        wide = widen(tensor.handle.data)
        val = idx = None
        with np.errstate(all="ignore"):
            if val_reduce_op:
                v = np.asarray(val_reduce_op(wide, axis=self.axis, keepdims=self.keep_dims), dtype=np.float32)
                val = self.to_tensor(narrow(v), tensor.dtype)
            if idx_reduce_op:
                idx = self.to_tensor(idx_reduce_op(wide, axis=self.axis, keepdims=self.keep_dims), tl.int32)
        if val is not None and idx is not None:
            return val, idx
        return val if val is not None else idx

    min_max._oracle_original = original
    return min_max


def _scan(kind):
    def wrap(original):
        def scan(self, input):
            name = input.dtype.scalar.name
            if name not in ("bf16", "fp16"):
                return original(self, input)
            values = np.moveaxis(_from16(input.handle.data, name), self.axis, 0)
            out = np.empty_like(values)
            acc = values[0]
            out[0] = acc
            with np.errstate(all="ignore"):
                for i in range(1, values.shape[0]):
                    acc = _from16(_to16(acc + values[i] if kind == "sum" else acc * values[i], name), name)
                    out[i] = acc
            result = _to16(np.moveaxis(out, 0, self.axis), name)
            return [self.to_tensor(result, dtype=input.dtype)]

        scan._oracle_original = original
        return scan
    return wrap


_PATCHES = {
    "InterpreterBuilder": {"binary_op": _binary_op, "unary_op": _unary_op, "create_fma": _fma,
                           "create_clampf": _clampf, "create_dot": _dot, "create_atomic_rmw": _atomic_rmw},
    "ReduceOps": {"sum": _reduce_sum, "min_max": _min_max},
    "ScanOps": {"cumsum": _scan("sum"), "cumprod": _scan("prod")},
}


def _get_bf16(self, value):
    """A bf16 constant (a Python float meeting a bf16 tensor); triton 3.6's builder has none."""
    from triton.runtime.interpreter import TensorHandle

    return TensorHandle(narrow(np.array([value], dtype=np.float32)), _bf16())


def _bf16():
    import triton.language as tl

    return tl.bfloat16


def complete_builder() -> None:
    """Give triton 3.6's interpreter builder the bf16 constant it lacks (``tl.where(m, x_bf16, 0.0)``
    fails there with "no attribute 'get_bf16'"); a no-op on a triton that has it."""
    import triton.runtime.interpreter as interp

    if not hasattr(interp.InterpreterBuilder, "get_bf16"):
        interp.InterpreterBuilder.get_bf16 = _get_bf16


def install() -> None:
    """Correct the loaded interpreter's 16-bit arithmetic (once; a method the triton lacks is left)."""
    import triton.runtime.interpreter as interp

    complete_builder()

    for cls_name, methods in _PATCHES.items():
        cls = getattr(interp, cls_name)
        for name, wrap in methods.items():
            current = cls.__dict__.get(name)
            if current is not None and not hasattr(current, "_oracle_original"):
                setattr(cls, name, wrap(current))


def uninstall() -> None:
    """The interpreter's own 16-bit arithmetic again (for tests proving the correction matters)."""
    import triton.runtime.interpreter as interp

    for cls_name, methods in _PATCHES.items():
        cls = getattr(interp, cls_name)
        for name in methods:
            current = cls.__dict__.get(name)
            if current is not None and hasattr(current, "_oracle_original"):
                setattr(cls, name, current._oracle_original)
