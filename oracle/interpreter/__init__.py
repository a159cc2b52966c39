"""Triton kernels on a machine without a GPU: Triton's CPU interpreter, with its bf16 casts made
faithful, for this repository's kernels and for any implementation the harness loads.

Note [Triton on the CPU]
    Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so the choice has to be made
    before an implementation's module is imported: ``choose_backend`` sets it to 1 on a machine with
    no CUDA device, unless the user set it either way. If triton was imported before that
    (torch._dynamo imports it, and transformers imports that), its own ``@jit`` helpers (tl.sum,
    ...) were built for a GPU and refuse to run in the interpreter, so its Python modules are
    dropped and built again on the next import (the compiled extension, triton._C, stays loaded).

Note [bf16 under the interpreter]
    The interpreter keeps bf16 values as raw uint16 bits. Its fp32 -> bf16 cast truncates instead
    of rounding to nearest even (about half of all values land one ULP off what a GPU stores), and
    casts between bf16 and fp64/fp16 reinterpret numbers as integers. Upstream declined to change
    this (triton issues 4972, 11584, 11604). A kernel that upcasts on load and rounds only on store
    (ours, and most hand-written ones) gets the GPU's bits once the casts are corrected.
    ``ensure_faithful_bf16`` probes the interpreter once, installs the correction when the probe
    shows truncation, and probes again to prove the correction took. Arithmetic on bf16 values is
    the subject of oracle/interpreter/arith.py (Note [16-bit arithmetic under the interpreter]),
    probed and proved the same way by ``ensure_faithful_16bit_arithmetic``.

Note [A library's kernels as shipped]
    ``make_faithful`` installs, once, everything else a kernel module needs to run here as it runs
    on a GPU, with no shim of its user's: every libdevice function, or its refusal by name
    (oracle/interpreter/libdevice.py); scalar arguments typed as a GPU launch types them, and each
    launch's kernel named for a refusal (oracle/interpreter/launch.py). ``prepare_for`` calls it
    for every implementation the harness loads. ``triton.heuristics`` needs nothing: it never
    touched the driver.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings

import torch

from oracle.interpreter.patches import unpatched


def choose_backend() -> None:
    """Put Triton kernels decorated from now on into the interpreter when there is no CUDA device
    (Note [Triton on the CPU]); an explicit TRITON_INTERPRET is the user's choice."""
    if "TRITON_INTERPRET" in os.environ or torch.cuda.is_available():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    for name in [n for n in sys.modules if (n == "triton" or n.startswith("triton.")) and not n.startswith("triton._C")]:
        del sys.modules[name]


def interpreted() -> bool:
    """True when Triton kernels run under the CPU interpreter (triton imported and told so)."""
    triton = sys.modules.get("triton")
    return triton is not None and bool(triton.knobs.runtime.interpret)


def quiet_ieee_warnings() -> None:
    """Under the interpreter numpy warns on IEEE overflow and invalid operations (exp(1000) = inf,
    -inf - -inf in a masked lane): what a GPU computes too, silently, and what HF computes."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")


# --- the bf16 cast correction (Note [bf16 under the interpreter]) -------------------------------------


def _rounding_cast_impl(original):
    """Wrap the interpreter's cast so that casts touching bf16 use torch's conversions (RNE), from
    floats and from integers (which the interpreter copies into the raw bits)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    torch_floats = {tl.float16: torch.float16, tl.float32: torch.float32, tl.float64: torch.float64}

    def cast_impl(self, src, dst_type):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if dst_ty == tl.bfloat16 and src_ty in torch_floats:
            values = torch.from_numpy(np.array(src.data, copy=True))
            bits = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return TensorHandle(bits, dst_ty)
        if src_ty == tl.bfloat16 and dst_ty in torch_floats:
            bits = torch.from_numpy(np.array(src.data, copy=True).view(np.int16))
            values = bits.view(torch.bfloat16).to(torch_floats[dst_ty]).numpy()
            return TensorHandle(values, dst_ty)
        # integers (and int1) to and from bf16: the interpreter moves the integer into the raw bits
        if dst_ty == tl.bfloat16 and (src_ty.is_int() or src_ty.is_bool()):
            values = torch.from_numpy(np.array(src.data, copy=True).astype(np.int64))
            bits = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return TensorHandle(bits, dst_ty)
        if src_ty == tl.bfloat16 and (dst_ty.is_int() or dst_ty.is_bool()):
            widened = (np.array(src.data, copy=True).astype(np.uint32) << np.uint32(16)).view(np.float32)
            return original(self, TensorHandle(widened, tl.float32), dst_type)
        return original(self, src, dst_type)

    cast_impl._oracle_original = original
    return cast_impl


def _interpreter_builder_class():
    from triton.runtime.interpreter import InterpreterBuilder

    return InterpreterBuilder


def _install_cast_correction() -> None:
    builder = _interpreter_builder_class()
    if not hasattr(builder.cast_impl, "_oracle_original"):
        builder.cast_impl = _rounding_cast_impl(builder.cast_impl)


@contextlib.contextmanager
def uncorrected_bf16_casts():
    """Run with the interpreter's own bf16 casts (for tests proving the correction matters)."""
    with unpatched(_interpreter_builder_class(), "cast_impl"):
        yield


@functools.cache
def _cast_probe_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def probe(Y_ptr, Z_ptr, X_ptr, n, BLOCK: tl.constexpr):  # Y: fp32 X rounded to bf16; Z: Y widened to fp64
        i = tl.arange(0, BLOCK)
        mask = i < n
        y = tl.load(X_ptr + i, mask=mask, other=0.0).to(tl.bfloat16)
        tl.store(Y_ptr + i, y, mask=mask)
        tl.store(Z_ptr + i, y.to(tl.float64), mask=mask)

    return probe


def _probe_values() -> torch.Tensor:
    """fp32 values whose bf16 rounding differs from truncation, plus ties, signs and specials."""
    gen = torch.Generator().manual_seed(0)
    random = torch.randn(1000, generator=gen) * torch.logspace(-30, 30, 1000)
    crafted = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 3 * 2.0**-8), 1.0 + 2.0**-7 + 2.0**-9,
                            0.0, -0.0, float("inf"), float("-inf"), 3.4e38, 1e-40])
    return torch.cat([random, crafted]).float()


def probe_bf16_casts() -> dict[str, float]:
    """Fraction of probe values the interpreter rounds differently from torch (fp32->bf16, bf16->fp64)."""
    x = _probe_values()
    y = torch.empty(x.numel(), dtype=torch.bfloat16)
    z = torch.empty(x.numel(), dtype=torch.float64)
    _cast_probe_kernel()[(1,)](y, z, x, x.numel(), BLOCK=2 ** (x.numel() - 1).bit_length())
    want = x.to(torch.bfloat16)
    return {
        "fp32_to_bf16": (y.view(torch.int16) != want.view(torch.int16)).float().mean().item(),
        "bf16_to_fp64": (z != want.double()).float().mean().item(),
    }


# --- 16-bit arithmetic (Note [16-bit arithmetic under the interpreter], oracle/interpreter/arith.py) ------


@functools.cache
def _arithmetic_probe_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def probe(Out_ptr, Red_ptr, A_ptr, B_ptr, C_ptr, n, BLOCK: tl.constexpr):
        # Out rows: a*b, a+b, a-b, a/b, -a, max(a, b), fma(a, b, c), (a < b); Red: sum, max of a, sum of c
        i = tl.arange(0, BLOCK)
        mask = i < n
        a = tl.load(A_ptr + i, mask=mask, other=0.0)
        b = tl.load(B_ptr + i, mask=mask, other=1.0)
        c = tl.load(C_ptr + i, mask=mask, other=0.0)
        tl.store(Out_ptr + i, a * b, mask=mask)
        tl.store(Out_ptr + n + i, a + b, mask=mask)
        tl.store(Out_ptr + 2 * n + i, a - b, mask=mask)
        tl.store(Out_ptr + 3 * n + i, a / b, mask=mask)
        tl.store(Out_ptr + 4 * n + i, -a, mask=mask)
        tl.store(Out_ptr + 5 * n + i, tl.maximum(a, b), mask=mask)
        tl.store(Out_ptr + 6 * n + i, tl.fma(a, b, c), mask=mask)
        tl.store(Out_ptr + 7 * n + i, (a < b).to(a.dtype), mask=mask)
        tl.store(Red_ptr, tl.sum(tl.where(mask, a, -0.0)))
        tl.store(Red_ptr + 1, tl.max(tl.where(mask, a, float("-inf"))))
        tl.store(Red_ptr + 2, tl.sum(tl.where(mask, c, -0.0)))

    return probe


def probe_16bit_arithmetic(dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """Fraction of elements where the interpreter's 16-bit arithmetic differs from torch's (fp32
    compute, rounded to ``dtype``), per operation; reductions are of values whose sums are exact."""
    gen = torch.Generator().manual_seed(0)
    n = 64
    a = (torch.randn(n, generator=gen) * 3).to(dtype)
    b = (torch.randn(n, generator=gen) + 4).to(dtype)
    c = torch.randint(-8, 8, (n,), generator=gen).to(dtype)  # small integers: every partial sum exact
    out = torch.empty(8 * n, dtype=dtype)
    red = torch.empty(3, dtype=dtype)
    _arithmetic_probe_kernel()[(1,)](out, red, a, b, c, n, BLOCK=n)
    af, bf, cf = a.float(), b.float(), c.float()
    want = {"mul": af * bf, "add": af + bf, "sub": af - bf, "div": af / bf, "neg": -af, "max": torch.maximum(af, bf),
            "fma": (af.double() * bf.double() + cf.double()), "lt": (af < bf).float()}
    got = out.view(8, n)
    result = {}
    for k, (name, value) in enumerate(want.items()):
        result[name] = (got[k].view(torch.int16) != value.to(dtype).view(torch.int16)).float().mean().item()
    result["sum_exact"] = float(red[2].item() != cf.sum().item())
    result["max_reduce"] = float(red[1].item() != af.max().item())
    result["sum_finite"] = float(not torch.isfinite(red[0]).item() or abs(red[0].item() - af.sum().item()) > 1.0)
    return result


@functools.cache
def ensure_faithful_16bit_arithmetic() -> str:
    """Make the interpreter's bf16 (and fp16) arithmetic what a GPU computes; returns 'native',
    'faithful' or 'corrected' as ``ensure_faithful_bf16`` does, and raises if the probe still
    disagrees after the correction."""
    if not interpreted():
        return "native"
    ensure_faithful_bf16()
    from oracle.interpreter import arith as interpreter_arith

    interpreter_arith.complete_builder()
    if not any(v for dt in (torch.bfloat16, torch.float16) for v in probe_16bit_arithmetic(dt).values()):
        return "faithful"
    interpreter_arith.install()
    remaining = {str(dt): {k: v for k, v in probe_16bit_arithmetic(dt).items() if v}
                 for dt in (torch.bfloat16, torch.float16)}
    if any(remaining.values()):
        raise RuntimeError(f"Triton {sys.modules['triton'].__version__}'s interpreter still computes 16-bit "
                           f"arithmetic unlike a GPU after correction: {remaining}")
    return "corrected"


@contextlib.contextmanager
def uncorrected_16bit_arithmetic():
    """Run with the interpreter's own 16-bit arithmetic (for tests proving the correction matters)."""
    from oracle.interpreter import arith as interpreter_arith

    ensure_faithful_16bit_arithmetic()
    interpreter_arith.uninstall()
    try:
        yield
    finally:
        interpreter_arith.install()


@functools.cache
def make_faithful() -> str:
    """Under the interpreter, install everything a kernel module needs to run here as on a GPU (Note [A
    library's kernels as shipped]); 'native' on a GPU."""
    if not interpreted():
        return "native"
    from oracle.interpreter import launch as interpreter_launch

    quiet_ieee_warnings()
    interpreter_launch.install()
    ensure_faithful_bf16()
    ensure_faithful_16bit_arithmetic()
    return "interpreter"


@functools.cache
def ensure_faithful_bf16() -> str:
    """Make the interpreter's bf16 casts round like the GPU; returns how: 'native' (no interpreter),
    'faithful' (nothing to correct) or 'corrected'. Cached after the first call. Raises if the
    interpreter still disagrees with round-to-nearest-even after the correction."""
    if not interpreted():
        return "native"
    if not any(probe_bf16_casts().values()):
        return "faithful"
    _install_cast_correction()
    remaining = probe_bf16_casts()
    if any(remaining.values()):
        raise RuntimeError(f"Triton {sys.modules['triton'].__version__}'s interpreter still mis-rounds bf16 after "
                           f"correction: {remaining}")
    return "corrected"


def prepare_for(module_name: str):
    """Import an implementation's module so that its Triton kernels run here as on a GPU: the
    interpreter chosen before its kernels are decorated, and, if it uses Triton, everything of
    ``make_faithful`` installed (Note [A library's kernels as shipped]). Returns the module."""
    import importlib

    choose_backend()
    module = importlib.import_module(module_name)
    if "triton" in sys.modules:
        _TRITON_USERS.add(module_name)
        make_faithful()
    return module


_TRITON_USERS: set[str] = set()  # implementation modules loaded by prepare_for once triton was imported


def prepared_modules() -> set[str]:
    """The modules ``prepare_for`` imported once triton was loaded."""
    return set(_TRITON_USERS)


def loaded_runtime() -> dict[str, str] | None:
    """Where the Triton kernels of implementations loaded by ``prepare_for`` run, for a report's
    environment; None when none was loaded with triton."""
    if not _TRITON_USERS:
        return None
    return {"backend": "triton-interpreter" if interpreted() else "cuda", "bf16_casts": ensure_faithful_bf16(),
            "bf16_arithmetic": ensure_faithful_16bit_arithmetic()}
