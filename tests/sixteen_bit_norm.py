"""A Triton RMSNorm (Llama's and Gemma's casting) with a hand-written backward, as a library writes
one, in two builds: ``correct`` computes the backward's row sum sum(g * normed) in float32;
``sixteen_bit_sum`` rounds it to the input's dtype, the defect that random incoming gradients cannot
see (it moves dX by about 1e-4 of its scale, below a 16-bit output's own rounding) and a gradient
along the output exposes (the projection then cancels dX to a small remainder, and the rounded sum
leaves an error at the scale of the cancelled terms). tests/test_gradient_kinds.py runs both."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oracle import Dim, Op, Tensor, implementation


@triton.jit
def _forward(X, W, Y, RSTD, n, eps, GEMMA: tl.constexpr, KEEP_RSTD: tl.constexpr, BLOCK: tl.constexpr):
    """``KEEP_RSTD``: also store each row's 1/rms in float32 (RSTD), for a backward from Y."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    if GEMMA:  # times 1 + W in float32, then rounded
        y = x * rstd * (1.0 + w)
    else:  # normed rounded to X's dtype, then times W in Y's dtype
        y = (x * rstd).to(X.dtype.element_ty).to(tl.float32) * w
    tl.store(Y + row * n + cols, y.to(Y.dtype.element_ty), mask=mask)
    if KEEP_RSTD:
        tl.store(RSTD + row, rstd)


@triton.jit
def _backward(X, W, DY, DX, DW_ROWS, n, eps, GEMMA: tl.constexpr, ROW_SUM_IN_16_BITS: tl.constexpr,
              BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    normed = x * rstd
    if GEMMA:
        g = dy * (1.0 + w)
        dw = dy * normed
    else:  # autograd's dY * W, rounded to X's dtype where normed was
        g = (dy * w).to(X.dtype.element_ty).to(tl.float32)
        dw = dy * normed.to(X.dtype.element_ty).to(tl.float32)
    row_sum = tl.sum(g * normed, axis=0)
    if ROW_SUM_IN_16_BITS:
        row_sum = row_sum.to(X.dtype.element_ty).to(tl.float32)
    dx = rstd * (g - normed * (row_sum / n))
    tl.store(DX + row * n + cols, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW_ROWS + row * n + cols, dw, mask=mask)


@triton.jit
def _backward_from_output(Y, W, RSTD, DY, DX, DW_ROWS, n, BLOCK: tl.constexpr):
    """The memory-saving design: normed recomputed as Y / W from the stored output, not from X."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    w = tl.load(W + cols, mask=mask, other=1.0).to(tl.float32)
    normed = tl.load(Y + row * n + cols, mask=mask, other=0.0).to(tl.float32) / w
    dy = tl.load(DY + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + row)
    g = (dy * w).to(DX.dtype.element_ty).to(tl.float32)
    dx = rstd * (g - normed * (tl.sum(g * normed, axis=0) / n))
    tl.store(DX + row * n + cols, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW_ROWS + row * n + cols, dy * normed.to(DX.dtype.element_ty).to(tl.float32), mask=mask)


class _FromOutput(torch.autograd.Function):
    """Llama's RMSNorm that saves Y (in X's dtype) and 1/rms for its backward instead of X."""

    @staticmethod
    def forward(ctx, X, W, eps):
        x = X.reshape(-1, X.shape[-1]).contiguous()
        rows, n = x.shape
        Y = torch.empty(x.shape, dtype=torch.promote_types(X.dtype, W.dtype), device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        if rows and n:
            _forward[(rows,)](x, W.contiguous(), Y, rstd, n, eps, GEMMA=False, KEEP_RSTD=True,
                              BLOCK=triton.next_power_of_2(n))
        ctx.save_for_backward(Y, W, rstd)
        ctx.shape, ctx.dtype = X.shape, X.dtype
        return Y.reshape(X.shape)

    @staticmethod
    def backward(ctx, dY):
        Y, W, rstd = ctx.saved_tensors
        rows, n = Y.shape
        dX = torch.empty(Y.shape, dtype=ctx.dtype, device=Y.device)
        dW_rows = torch.zeros(rows, n, dtype=torch.float32, device=Y.device)
        if rows and n:
            _backward_from_output[(rows,)](Y, W.contiguous(), rstd, dY.reshape(-1, n).contiguous(), dX, dW_rows, n,
                                           BLOCK=triton.next_power_of_2(n))
        return dX.reshape(ctx.shape), dW_rows.sum(0).to(W.dtype), None


def _build(row_sum_in_16_bits: bool):
    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, X, W, eps, gemma):
            x = X.reshape(-1, X.shape[-1]).contiguous()
            rows, n = x.shape
            Y = torch.empty(x.shape, dtype=X.dtype if gemma else torch.promote_types(X.dtype, W.dtype), device=x.device)
            if rows and n:
                _forward[(rows,)](x, W.contiguous(), Y, Y, n, eps, GEMMA=gemma, KEEP_RSTD=False,
                                  BLOCK=triton.next_power_of_2(n))
            ctx.save_for_backward(x, W)
            ctx.eps, ctx.gemma, ctx.shape = eps, gemma, X.shape
            return Y.reshape(X.shape)

        @staticmethod
        def backward(ctx, dY):
            x, W = ctx.saved_tensors
            rows, n = x.shape
            dy = dY.reshape(-1, n).contiguous()
            dX = torch.empty_like(x)
            dW_rows = torch.zeros(rows, n, dtype=torch.float32, device=x.device)
            if rows and n:
                _backward[(rows,)](x, W.contiguous(), dy, dX, dW_rows, n, ctx.eps, GEMMA=ctx.gemma,
                                   ROW_SUM_IN_16_BITS=row_sum_in_16_bits, BLOCK=triton.next_power_of_2(n))
            return dX.reshape(ctx.shape), dW_rows.sum(0).to(W.dtype), None, None

    def rms_norm(X, W, eps, gemma=False):
        return RMSNorm.apply(X, W, eps, gemma)

    return rms_norm


def _llama_rms_norm(X, W, eps):
    """Hugging Face's LlamaRMSNorm, as a user declares it: normalise in float32, round, times W."""
    h = X.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return W * h.to(X.dtype)


# The norm as a user declares it from their own repository: rows of 16 columns or more (no one-column
# row, where dX cancels whatever the incoming gradient), no tolerance written.
WIDE_RMS_NORM = Op("wide_rms_norm", reference=_llama_rms_norm,
                   inputs={"X": Tensor("rows", "cols"), "W": Tensor("cols", values="weight")},
                   dims={"rows": Dim(1, 64, programs=True), "cols": Dim(16, 1024, special=(16, 100, 256, 1000))},
                   params={"eps": 1e-6}, outputs=("Y",))


def _as_declared(rms_norm):
    return lambda X, W, eps: rms_norm(X, W, eps)


# Neither computes in float64 (the float64 checks are not asked of it).
_correct, _sixteen_bit_sum = _build(False), _build(True)
correct = implementation(rms_norm=_correct, wide_rms_norm=_as_declared(_correct),
                         NO_FLOAT64={"rms_norm", "wide_rms_norm"})
sixteen_bit_sum = implementation(rms_norm=_sixteen_bit_sum, wide_rms_norm=_as_declared(_sixteen_bit_sum),
                                 NO_FLOAT64={"rms_norm", "wide_rms_norm"})
# The backward from the saved output, as it declares itself (oracle/noise/saved.py, Note [Saved
# activations in the input dtype]) and as it would be without the declaration.
_from_output = _as_declared(lambda X, W, eps, gemma=False: _FromOutput.apply(X, W, eps))
saved_output = implementation(wide_rms_norm=_from_output, NO_FLOAT64={"wide_rms_norm"},
                              SAVED_IN_INPUT_DTYPE={"wide_rms_norm"})
saved_output_undeclared = implementation(wide_rms_norm=_from_output, NO_FLOAT64={"wide_rms_norm"})
