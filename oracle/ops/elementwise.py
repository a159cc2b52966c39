"""What gated element-wise MLP ops (SwiGLU, GeGLU, ...) share on the harness's side: their shape and
tensors, the report's and the scale grids, float64 cases, bad inputs, and HF's maths for the raw
kernels' contract (a new h; or h, df, de written into DW, e, g). An op module declares its ops with these.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from oracle import Dim, ErrorInput, Tensor


def lora_backward(forward: Callable, DW, e, g, compute=None):
    """(h, df, de) by HF's autograd of ``h = forward(e, g)`` for the incoming gradient DW: what a raw
    LoRA-MLP backward kernel must produce (df: g's gradient, de: e's). torch.autograd.grad, not
    torch.func.vjp: vjp decomposes silu's backward, and in bf16 half of de's bits then differ."""
    e_leaf, g_leaf = e.detach().requires_grad_(), g.detach().requires_grad_()
    with torch.enable_grad():
        h = forward(e_leaf, g_leaf, compute=compute)
        de, df = torch.autograd.grad(h, (e_leaf, g_leaf), DW)
    return h.detach(), df, de


def raw_forward(reference: Callable) -> Callable:
    """HF's maths as a raw forward kernel: a new h, outside autograd."""
    return lambda e, g: reference(e, g).detach()


_HF_RAW_BACKWARDS: dict[str, Callable] = {}


def raw_backward_into_buffers(reference: Callable, name: str) -> Callable:
    """HF's maths as the raw backward kernel ``name``: h, df, de computed, then written into DW, e, g.

    Like the kernels' raw backwards it is a torch.library custom op (``oracle_hf::<name>``, DW, e
    and g mutated) behind a wrapper returning the buffers: torch.autograd.grad inside is a graph
    break under torch.compile(fullgraph=True), an opaque op is not, so the compile check holds HF's
    raw backwards to their eager bits as it holds any implementation's. An op's body runs below
    autograd's dispatch keys, where nothing records a graph, so HF's autograd runs in a thread of
    its own (dispatch state is per thread; a new one starts with autograd on)."""
    if name in _HF_RAW_BACKWARDS:  # one op per name, however often the op's module builds its specs
        return _HF_RAW_BACKWARDS[name]

    @torch.library.custom_op(f"oracle_hf::{name}", mutates_args=("DW", "e", "g"))
    def op(DW: torch.Tensor, e: torch.Tensor, g: torch.Tensor) -> None:
        with ThreadPoolExecutor(1) as autograd_on:
            h, df, de = autograd_on.submit(reference, DW, e, g).result()
        with torch.no_grad():
            DW.copy_(h)
            e.copy_(df)
            g.copy_(de)

    op.register_fake(lambda DW, e, g: None)

    def backward(DW, e, g):
        op(DW, e, g)
        return DW, e, g

    backward.custom_op = op
    _HF_RAW_BACKWARDS[name] = backward
    return backward


# --- what their declarations share ---------------------------------------------------------------

# The tensors' one shape, two or three sizes, rows by columns; the budget caps what is drawn.
# Element counts drawn half the time: one, a few, around the 1024-element block, past four and eight
# of them, and past 64 (the first tile boundary in programs, where the budget reaches it).
SHAPE = {"shape": Dim(1, 2**24, special=(1, 3, 1023, 1024, 1025, 4097, 8193, 65537), split=3, per_row=True)}
# Every kind of values but zero rows: an element-wise op reduces no row, so a zero row is only zeros.
VALUE_KINDS = ("normal", "large", "tiny", "outliers", "nonfinite")


def sweep(full: bool, autograd: bool) -> tuple[dict, ...]:
    """The report's grid: a single element to Llama-3-8B's MLP width; an autograd op's 2-D shapes
    of several rows also transposed, with strided gradients; and large values past the medium."""
    shapes = [[1, 1], [3, 1000], [2, 3, 1025], [64, 4097]] if not full else \
        [[1, 1], [3, 1000], [2, 3, 1025], [1024, 4097], [16, 256, 1024], [4096, 14336]]
    points = []
    for shape in shapes:
        transposed = autograd and len(shape) == 2 and shape[0] > 1
        points.append({"dims": {"shape": shape}} | ({"layout": "transposed", "grad_layout": "strided"}
                                                     if transposed else {}))
    return (*points, {"dims": {"shape": [4, 999]}, "values": "large"})


# The scale grid: Llama-3-8B's MLP width (14336) at just past 2^31 elements in 16-bit, where a 32-bit
# element offset wraps (about 2^30 in float32: see rms_norm's _SCALE_SHAPES).
SCALE = ({"dims": {"shape": [2**30 // 14336 + 1, 14336]}, "dtypes": ("float32",)},
         {"dims": {"shape": [2**31 // 14336 + 1, 14336]}, "dtypes": ("float16", "bfloat16")})


def float64_cases(autograd: bool, variants: tuple[str, ...] = ("default",)) -> tuple[dict, ...]:
    """One small case per variant: an autograd op's transposed, a raw kernel's (flat by contract)
    contiguous with outliers."""
    layout = {"layout": "transposed"} if autograd else {"values": "outliers"}
    return tuple({"variant": variant, "dims": {"shape": [3, 7]}, "seed": 1} | layout for variant in variants)


def tensors(*names: str, autograd: bool) -> dict[str, Tensor]:
    """The op's tensors, all of the one shape: an autograd op's in the case's layout; a raw kernel's
    contiguous (flat by contract). DW is an incoming gradient: normal values whatever the case's kind."""
    return {name: Tensor("shape", values="normal" if name == "DW" else "case", layout=autograd) for name in names}


def elementwise_errors(names: tuple[str, ...], raw: bool) -> Callable[[], list[ErrorInput]]:
    """The error inputs of the autograd op (raw=False) and of the raw kernels, whose arguments are
    ``names``: ("e", "g"), or ("DW", "e", "g") for the backward, which writes into all three."""
    writes_inputs = "DW" in names

    def errors() -> list[ErrorInput]:
        def args(d, shapes=None, dtypes=None, transposed=(), **given):
            gen = torch.Generator().manual_seed(0)
            shapes = {n: (3, 4) for n in names} | (shapes or {})
            dtypes = dtypes or {}
            out = {}
            for n in names:
                t = torch.randn(shapes[n], generator=gen).to(device=d, dtype=dtypes.get(n, torch.float32))
                out[n] = t.t().contiguous().t() if n in transposed else t
            return out | given

        def views_of_one_buffer(d, rows_apart: int):
            """Each argument a block of 3 rows of one buffer, starting ``rows_apart`` rows after the previous."""
            buffer = torch.randn(3 + rows_apart * (len(names) - 1), 4, device=d)
            return {n: buffer[i * rows_apart: i * rows_apart + 3] for i, n in enumerate(names)}

        def same_tensor(first: str, second: str):
            return lambda d: (lambda a: a | {second: a[first]})(args(d))

        def values(d, *rows):
            return args(d, **{n: torch.tensor(rows, device=d) for n in names})

        out = [
            ErrorInput("shapes differ", lambda d: args(d, shapes={"g": (3, 5)}), ValueError, "shapes must match"),
            ErrorInput("g broadcastable but not e's shape", lambda d: args(d, shapes={"g": (4,)}), ValueError,
                       "shapes must match"),
            ErrorInput("dtypes differ", lambda d: args(d, dtypes={"g": torch.float16}), TypeError, "dtypes must match"),
            ErrorInput("integer e", lambda d: args(d, dtypes={"e": torch.int32}), TypeError, "e must be"),
            ErrorInput("bool g", lambda d: args(d, dtypes={"g": torch.bool}), TypeError, "g must be"),
            ErrorInput("complex e", lambda d: args(d, dtypes={"e": torch.complex64}), TypeError, "e must be"),
            ErrorInput("e a list", lambda d: args(d, e=[[1.0] * 4] * 3), TypeError, r"e must be a torch\.Tensor"),
            ErrorInput("g None", lambda d: args(d, g=None), TypeError, r"g must be a torch\.Tensor"),
            ErrorInput("g on another device", lambda d: args(d, g=torch.randn(3, 4, device="meta")), ValueError,
                       "one device"),
            ErrorInput("every tensor on meta", lambda d: args("meta"), ValueError, "kernels run on"),
            ErrorInput.same_as_hf("zero elements", lambda d: args(d, shapes={n: (0, 5) for n in names})),
            ErrorInput.same_as_hf("0-d tensors", lambda d: args(d, shapes={n: () for n in names})),
            ErrorInput.same_as_hf("float64", lambda d: args(d, dtypes={n: torch.float64 for n in names})),
            ErrorInput.same_as_hf("NaN, inf and huge values", lambda d: values(d, [math.nan, math.inf, -math.inf, 1e30],
                                                                               [-1e30, 100.0, -100.0, 0.0])),
            ErrorInput.same_as_hf("fp16 products overflowing to inf",
                                  lambda d: args(d, dtypes={n: torch.float16 for n in names},
                                                 **{n: torch.full((3, 4), 300.0, dtype=torch.float16, device=d)
                                                    for n in names})),
            ErrorInput.same_as_hf("disjoint views of one buffer", lambda d: views_of_one_buffer(d, rows_apart=3)),
        ]
        if raw:
            out += [
                ErrorInput("non-contiguous e", lambda d: args(d, transposed=("e",)), ValueError, "contiguous"),
                ErrorInput("expanded e", lambda d: args(d, e=torch.randn(1, 4, device=d).expand(3, 4)), ValueError,
                           "contiguous"),
            ]
        else:
            out += [
                ErrorInput.same_as_hf("column-major e", lambda d: args(d, transposed=("e",))),
                ErrorInput.same_as_hf("expanded e", lambda d: args(d, e=torch.randn(1, 4, device=d).expand(3, 4))),
                ErrorInput.same_as_hf("e and g requiring grad",
                                      lambda d: {n: t.requires_grad_() for n, t in args(d).items()}),
            ]
        if raw and not writes_inputs:
            # A raw forward's result has no graph: with grad mode on, refused rather than silently
            # giving e and g no gradient (docs/design.md §2).
            out.append(ErrorInput("e requiring grad, grad mode on",
                                  lambda d: (lambda a: a | {"e": a["e"].requires_grad_()})(args(d)), RuntimeError,
                                  "raw kernel outside autograd"))
        if writes_inputs:
            # torch's in-place ops refuse to overwrite a leaf that requires grad (or a view of one),
            # with a RuntimeError; a raw backward writes its buffers in place and does the same.
            out += [
                ErrorInput("DW a leaf requiring grad, grad mode on",
                           lambda d: (lambda a: a | {"DW": a["DW"].requires_grad_()})(args(d)), RuntimeError,
                           "DW is a leaf Variable that requires grad"),
                ErrorInput("g a view of a leaf requiring grad, grad mode on",
                           lambda d: args(d, g=torch.randn(6, 4, device=d, requires_grad=True)[:3]), RuntimeError,
                           "g is a view of a leaf Variable that requires grad"),
            ]
            out += [
                ErrorInput("DW is e", same_tensor("DW", "e"), ValueError, "DW and e share memory"),
                ErrorInput("DW is g", same_tensor("DW", "g"), ValueError, "DW and g share memory"),
                ErrorInput("e is g", same_tensor("e", "g"), ValueError, "e and g share memory"),
                ErrorInput("e, g and DW overlapping views of one buffer",
                           lambda d: views_of_one_buffer(d, rows_apart=1), ValueError, "share memory"),
                ErrorInput("DW is e through DLPack",
                           lambda d: (lambda a: a | {"DW": torch.from_dlpack(a["e"])})(args(d)), ValueError,
                           "DW and e share memory"),
            ]
        else:
            out.append(ErrorInput.same_as_hf("e is g", same_tensor("e", "g")))  # read only: sharing is harmless
        return out

    return errors
