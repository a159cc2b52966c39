"""Rotary position embedding applied to Q and K in place; backward is the same kernel rotating back.

HF's ``apply_rotary_pos_emb(q, k, cos, sin)`` with ``rotate_half(x) = cat(-x2, x1)`` gives, per head
row split into halves x1, x2 and the table row (c1 c2), (s1 s2) of the token's position:

    y1 = x1 * c1 - x2 * s1        every product and sum rounded to the model dtype, as HF's
    y2 = x2 * c2 + x1 * s2        eager ops do (and fp-fusion off, so no fused multiply-add)

The rotation is orthogonal, so its backward is the transposed rotation of the incoming gradient:

    dx1 = dy1 * c1 + dy2 * s2     = the forward formula with sin negated (and its halves swapped,
    dx2 = dy2 * c2 - dy1 * s1       which changes nothing for HF's tables, whose halves are equal)

Forward rotates the caller's Q and K buffers in place (the seed's memory saving: no new
activation, nothing saved but the table) and tells autograd so with ``mark_dirty``. Backward
writes new tensors and never touches its incoming gradient.

Grid: (batch * seq, groups of GROUP_SIZE heads). Each program loads its token's cos/sin row once
and rotates up to GROUP_SIZE heads of Q and of K as one 2-D block; masks stop the last group at
n_heads (and at n_kv_heads for K, which has fewer heads under GQA).

Note [RoPE under torch.compile]
    The launch is the custom op ``kernel_oracle::rope``, whose schema marks Q and K mutated (their
    ``CLOBBERS``). torch refuses an autograd formula for an op that mutates, so in eager mode the
    wrapper runs the op below autograd and records the rotation with ``RotatedInPlace``, whose
    ``mark_dirty`` on the views' bases (Note [Marking the buffers dirty]) is what lets Q and K be
    views of a fused projection. Dynamo cannot trace ``mark_dirty``, so under torch.compile the
    wrapper takes another path with the same results: the functional op ``rope_rotated`` (Q and K
    rotated into new tensors by the same kernel; its gradient is the same op rotating back) and
    ``Q.copy_``, ``K.copy_`` back into the caller's buffers, which autograd, functionalization and
    Inductor all understand (Inductor may then write in place again). What changes there: the
    eager-only refusals read view metadata or memory that a fake tensor does not have, so under
    compile torch's own errors take their place (copy_ into a leaf that requires grad, into a
    view from split/unbind, into an expanded tensor raises RuntimeError); Q and K sharing memory
    with each other or a table is not refused there, and the write-backs land in order, as two
    copy_ calls would. The positions' range check runs inside both ops, on real tensors.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import triton
import triton.language as tl
from torch._C._autograd import CreationMeta
from torch._C._autograd import _get_creation_meta as _creation_meta
from torch.autograd.graph import increment_version

from . import _checks
from ._launch import TL_COMPUTE, cdiv, next_power_of_2
from ._launcher import launch
from ._library import calls, custom_op, tracing
from ._runtime import launching

# Heads per program: amortises the token's cos/sin loads over several heads. The seed groups 4;
# 8 measured faster on the H200 (Llama-3-8B shapes, bf16: 0.096 -> 0.087 ms, 82% -> 90% of copy).
GROUP_SIZE = 8


@triton.jit
def _rotate_heads(
    In_ptr, In_sb, In_sh, In_ss, In_sd,  # rows to rotate: Q or K (forward), dQ or dK (backward)
    Out_ptr, Out_sb, Out_sh, Out_ss, Out_sd,  # where the rotated rows go (the same buffer in forward)
    b, s, heads, n_heads, cols, col_mask, half_dim,
    c1, c2, sa, sb,  # table halves already in the model dtype; sa multiplies x2, sb multiplies x1
    COMPUTE: tl.constexpr,
):
    dtype: tl.constexpr = Out_ptr.dtype.element_ty
    mask = (heads < n_heads)[:, None] & col_mask[None, :]

    # Load both halves of every head row in the group.
    row_in = In_ptr + b * In_sb + s * In_ss + heads[:, None] * In_sh
    x1 = tl.load(row_in + cols[None, :] * In_sd, mask=mask, other=0.0).to(COMPUTE)
    x2 = tl.load(row_in + (cols[None, :] + half_dim) * In_sd, mask=mask, other=0.0).to(COMPUTE)

    # Rotate with HF's roundings: each product is rounded to the model dtype (.to(dtype).to(COMPUTE)),
    # then their sum is rounded by the store.
    y1 = (x1 * c1[None, :]).to(dtype).to(COMPUTE) + (x2 * sa[None, :]).to(dtype).to(COMPUTE)
    y2 = (x2 * c2[None, :]).to(dtype).to(COMPUTE) + (x1 * sb[None, :]).to(dtype).to(COMPUTE)

    # Write: all loads of this block happened above, so in-place rotation is safe. Nothing here reads
    # the rows again, so they leave L2 first (forward+backward 1-1.4% faster on an H100, plain and
    # packed; docs/performance.md, "RoPE's L2 eviction hints").
    row_out = Out_ptr + b * Out_sb + s * Out_ss + heads[:, None] * Out_sh
    tl.store(row_out + cols[None, :] * Out_sd, y1, mask=mask, eviction_policy="evict_first")
    tl.store(row_out + (cols[None, :] + half_dim) * Out_sd, y2, mask=mask, eviction_policy="evict_first")


@triton.jit(debug=True)  # compiles the range check's device assertion in (Note [The range check in the kernel])
def _rope_kernel(
    Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd,  # (batch, n_heads, seq, head_dim), any strides
    Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
    Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd,  # (batch, n_kv_heads, seq, head_dim)
    Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
    cos_ptr, cos_row_stride, cos_col_stride,  # table (max_pos, head_dim)
    sin_ptr, sin_row_stride, sin_col_stride,
    pos_ptr, pos_b_stride, pos_s_stride,  # (batch, seq) table row per token, if HAS_POSITIONS
    max_pos, seq_len, n_heads, n_kv_heads, half_dim,
    HAS_POSITIONS: tl.constexpr,
    BACKWARD_PASS: tl.constexpr,  # rotate back: the same kernel with sin negated
    COMPUTE: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    b = token // seq_len
    s = token % seq_len
    heads = tl.program_id(1).to(tl.int64) * GROUP_SIZE + tl.arange(0, GROUP_SIZE)
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)  # 64-bit addressing
    col_mask = cols < half_dim
    dtype: tl.constexpr = Qout_ptr.dtype.element_ty

    # The token's table row, cast to the model dtype as HF's rotary embedding does. A position outside
    # the table stops the stream (a device-side assertion), reads row 0 instead of past the table,
    # and writes nothing.
    if HAS_POSITIONS:
        pos = tl.load(pos_ptr + b * pos_b_stride + s * pos_s_stride).to(tl.int64)
        inside = (pos >= 0) & (pos < max_pos)
        tl.device_assert(inside, "position_ids outside the table's rows")
        pos = tl.where(inside, pos, 0)
        col_mask = cols < tl.where(inside, half_dim, 0)  # (a scalar & a block: Triton's interpreter errs)
    else:
        pos = s
    cos_row = cos_ptr + pos * cos_row_stride
    sin_row = sin_ptr + pos * sin_row_stride
    c1 = tl.load(cos_row + cols * cos_col_stride, mask=col_mask, other=0.0).to(dtype).to(COMPUTE)
    c2 = tl.load(cos_row + (cols + half_dim) * cos_col_stride, mask=col_mask, other=0.0).to(dtype).to(COMPUTE)
    s1 = tl.load(sin_row + cols * sin_col_stride, mask=col_mask, other=0.0).to(dtype).to(COMPUTE)
    s2 = tl.load(sin_row + (cols + half_dim) * sin_col_stride, mask=col_mask, other=0.0).to(dtype).to(COMPUTE)
    if BACKWARD_PASS:
        sa = s2
        sb = -s1
    else:
        sa = -s1
        sb = s2

    _rotate_heads(Qin_ptr, Qin_sb, Qin_sh, Qin_ss, Qin_sd, Qout_ptr, Qout_sb, Qout_sh, Qout_ss, Qout_sd,
                  b, s, heads, n_heads, cols, col_mask, half_dim, c1, c2, sa, sb, COMPUTE)
    _rotate_heads(Kin_ptr, Kin_sb, Kin_sh, Kin_ss, Kin_sd, Kout_ptr, Kout_sb, Kout_sh, Kout_ss, Kout_sd,
                  b, s, heads, n_kv_heads, cols, col_mask, half_dim, c1, c2, sa, sb, COMPUTE)


def _launch(Q_in, Q_out, K_in, K_out, cos, sin, position_ids, backward: bool) -> None:
    """One launch rotating Q (and K, unless K_in is None) from *_in into *_out."""
    batch, n_heads, seq, head_dim = Q_out.shape
    if K_in is None:  # rotate Q alone: point K at Q with no heads, so every K lane is masked off
        K_in, K_out, n_kv_heads = Q_in, Q_out, 0
    else:
        n_kv_heads = K_out.shape[1]
    half = head_dim // 2
    block_half = next_power_of_2(half)
    has_positions = position_ids is not None
    pos = position_ids if has_positions else cos  # any tensor; never read without HAS_POSITIONS
    pos_strides = position_ids.stride() if has_positions else (0, 0)
    grid = (batch * seq, cdiv(n_heads, GROUP_SIZE))
    with launching():
        launch(
            _rope_kernel, grid,
            Q_in, *Q_in.stride(), Q_out, *Q_out.stride(), K_in, *K_in.stride(), K_out, *K_out.stride(),
            cos, *cos.stride(), sin, *sin.stride(), pos, *pos_strides,
            cos.shape[0], seq, n_heads, n_kv_heads, half,
            HAS_POSITIONS=has_positions, BACKWARD_PASS=backward,
            COMPUTE=TL_COMPUTE[_checks.compute_dtype(Q_out)], GROUP_SIZE=GROUP_SIZE, BLOCK_HALF=block_half,
            num_warps=rope_warps(block_half),
            enable_fp_fusion=False,  # a fused multiply-add would skip one of HF's roundings
        )


def rope_warps(block_half: int) -> int:
    """Warps per program: one per 512 elements of the GROUP_SIZE x half-head block, 1 to 8
    (8 heads of 128 take one warp: measured fastest on the H200)."""
    return max(1, min(8, GROUP_SIZE * block_half // 512))


class _Placement:
    """Where Q (or K) lies in the buffer that autograd is told about: its shape and strides, and its
    first element's offset from the buffer's; ``whole`` when it is the buffer itself (not a view),
    the common case, which backward then uses as it comes."""

    __slots__ = ("buffer", "shape", "stride", "offset", "numel", "whole")

    def __init__(self, buffer: int, t: torch.Tensor, owner: torch.Tensor) -> None:
        self.buffer = buffer  # index into RotatedInPlace's buffers
        self.shape, self.stride = tuple(t.shape), t.stride()
        self.offset = t.storage_offset() - owner.storage_offset()
        self.numel = t.numel()
        self.whole = t is owner

    def within(self, t: torch.Tensor) -> torch.Tensor:
        """The same place in ``t``, a tensor laid out like the buffer."""
        return t if self.whole else t.as_strided(self.shape, self.stride, t.storage_offset() + self.offset)


def _buffers(Q: torch.Tensor, K: torch.Tensor) -> tuple[list[torch.Tensor], tuple[_Placement, _Placement]]:
    """The tensors that own Q's and K's memory (each one's view base, or itself), once each, and
    where Q and K lie in them."""
    buffers: list[torch.Tensor] = []
    placements = []
    for t in (Q, K):
        owner = t._base if t._is_view() else t
        index = next((i for i, b in enumerate(buffers) if b is owner), None)
        if index is None:
            index = len(buffers)
            buffers.append(owner)
        placements.append(_Placement(index, t, owner))
    return buffers, tuple(placements)


def _layouts(buffers, placements) -> list[tuple[torch.Size, tuple[int, ...], bool]]:
    """Each buffer's shape and strides, and whether Q and K leave part of it out (V of a fused
    projection): what backward needs to lay out a buffer's gradient."""
    return [(b.shape, b.stride(), sum(p.numel for p in placements if p.buffer == i) != b.numel())
            for i, b in enumerate(buffers)]


class RotatedInPlace(torch.autograd.Function):
    """Autograd's record that Q and K were rotated in place: one node for both, so that backward
    rotates dQ and dK back in one launch.

    Note [Marking the buffers dirty]
        In a model Q and K are views (of a projection, through ``.view(...).transpose(1, 2)``), and
        autograd refuses a Function that modifies a view in place and returns more than one tensor.
        So the node marks dirty what owns the memory: each view's base (or Q and K themselves when
        they are not views; once, when both are views of one fused projection). Autograd then
        re-derives Q's and K's history from their bases, as after any in-place write to a base,
        and bumps every version counter involved, so anything that saved the old values raises.
        Backward receives each buffer's gradient, rotates the parts that held Q and K back, in one
        launch, into new tensors laid out like the buffers; the rest of a buffer (V of a fused
        projection) passes through unchanged. The incoming gradients are never written.
    """

    @staticmethod
    def forward(ctx, placements, cos, sin, position_ids, *buffers):
        ctx.mark_dirty(*buffers)
        ctx.set_materialize_grads(False)
        ctx.placements = placements
        ctx.layouts = _layouts(buffers, placements)
        ctx.save_for_backward(cos, sin, position_ids)
        return buffers

    @staticmethod
    def backward(ctx, *grads):
        cos, sin, position_ids = ctx.saved_tensors
        sources, results = [], []
        for (shape, stride, partial), grad in zip(ctx.layouts, grads):
            result = None if grad is None else torch.empty_strided(shape, stride, dtype=grad.dtype, device=grad.device)
            if grad is not None and (partial or grad.stride() != stride):
                result.copy_(grad)  # rotate inside a copy: other layout, or parts that pass through
                grad = result
            sources.append(grad)
            results.append(result)
        rotated = [(p.within(sources[p.buffer]), p.within(results[p.buffer]))
                   for p in ctx.placements if sources[p.buffer] is not None and p.numel > 0]
        if rotated:
            if position_ids is not None:  # written since forward? (.data and numpy writes bump no version)
                require_positions_in_table(position_ids, cos.shape[0])
            (first_in, first_out), *rest = rotated
            second_in, second_out = rest[0] if rest else (None, None)
            _launch(first_in, first_out, second_in, second_out, cos, sin, position_ids, backward=True)
        return (None, None, None, None, *results)


def _validate(Q, K, cos, sin, position_ids) -> torch.Tensor | None:
    """Every check that metadata decides (traceable: torch.compile turns them into guards); returns
    position_ids as (batch, seq) (a (1, seq) row broadcast, as HF broadcasts it), or None. The checks
    that read memory run in the ops (``_require_safe_memory``)."""
    for name, t in (("Q", Q), ("K", K), ("cos", cos), ("sin", sin)):
        _checks.require_float(name, t)
    _checks.require_ndim("Q", Q, 4, "(batch, n_heads, seq, head_dim)")
    _checks.require_ndim("K", K, 4, "(batch, n_kv_heads, seq, head_dim)")
    _checks.require_same_dtype(Q=Q, K=K)
    tensors = {"Q": Q, "K": K, "cos": cos, "sin": sin}
    if position_ids is not None:
        tensors["position_ids"] = _checks.require_tensor("position_ids", position_ids)
    _checks.require_kernel_device(**tensors)

    batch, n_heads, seq, head_dim = Q.shape
    if (K.shape[0], K.shape[2], K.shape[3]) != (batch, seq, head_dim):
        raise ValueError(f"K {tuple(K.shape)} must match Q {tuple(Q.shape)} in batch, seq and head_dim")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even to rotate pairs, got {head_dim}")
    if n_heads == 0 or K.shape[1] == 0 or n_heads % K.shape[1]:  # n_heads 0 would launch no program for K
        raise ValueError(f"n_heads ({n_heads}) must be a positive multiple of n_kv_heads ({K.shape[1]})")
    if cos.dim() != 2 or cos.shape[1] != head_dim or sin.shape != cos.shape:
        raise ValueError(f"cos and sin must both be (max_pos, head_dim={head_dim}), "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    return _positions_per_token(position_ids, batch, seq, cos.shape[0])


# Views whose base autograd forbids writing in place (the write would be found only after the kernel ran).
_FORBIDDEN_VIEWS = {
    CreationMeta.MULTI_OUTPUT_NODE: "a view from a function returning several views (split, chunk, unbind)",
    CreationMeta.NO_GRAD_MODE: "a view made in no_grad mode",
    CreationMeta.INFERENCE_MODE: "a view made in inference mode",
    CreationMeta.IN_CUSTOM_FUNCTION: "a view made inside a custom autograd Function",
}


def _require_rotatable_in_place(name: str, t: torch.Tensor) -> None:
    """Refuse, before the kernel runs, what autograd would refuse after it (the data would be lost)."""
    if torch.is_grad_enabled() and t.requires_grad:
        base = t._base if t._is_view() else t
        if base.is_leaf:
            what = "is a leaf" if base is t else "is a view of a leaf"
            raise ValueError(f"rope rotates {name} in place, and {name} {what} that requires grad; "
                             f"pass {name}.clone() (autograd forbids in-place changes to such leaves)")
        what = _FORBIDDEN_VIEWS.get(_creation_meta(t)) if base is not t else None
        if what:
            raise ValueError(f"rope rotates {name} in place, and {name} is {what}, which autograd forbids "
                             f"changing in place; slice it instead (qkv[..., :n]) or pass {name}.clone()")


POSITION_DTYPES = (torch.int64, torch.int32)  # what torch indexing (HF's cos[position_ids]) takes as indices


def _positions_per_token(position_ids, batch: int, seq: int, max_pos: int) -> torch.Tensor | None:
    """position_ids checked for dtype and shape, and a (1, seq) row broadcast over the batch (stride 0)."""
    if position_ids is None:
        if seq > max_pos:
            raise ValueError(f"seq ({seq}) exceeds the table's {max_pos} positions")
        return None
    if position_ids.dtype not in POSITION_DTYPES:
        raise TypeError(f"position_ids must be an int64 or int32 tensor, got {position_ids.dtype}")
    if position_ids.shape == (batch, seq):  # first: no new view on every call when nothing needs broadcasting
        return position_ids
    if position_ids.dim() == 2 and position_ids.shape[0] == 1 and position_ids.shape[1] == seq:
        return position_ids.expand(batch, seq)
    raise ValueError(f"position_ids must be (batch, seq) = ({batch}, {seq}) or (1, seq), "
                     f"got {tuple(position_ids.shape)}")


def require_positions_in_table(position_ids: torch.Tensor, max_pos: int) -> None:
    """Every position must name a row of the table, or the kernel would read past it.

    Checked on every call: a verdict remembered between calls could be bypassed by writes that no
    version counter sees (through ``.data``, numpy, DLPack or another kernel). On the CPU one fused
    min/max and a host read raise ValueError before the launch. On a GPU the kernel checks each
    token's position as it loads it (Note [The range check in the kernel]).
    """
    if position_ids.numel() == 0:
        return
    if max_pos == 0:  # an empty table has no row to name
        raise ValueError("position_ids outside the table: cos and sin have 0 rows")
    if position_ids.is_cuda:
        return
    low, high = torch.stack(torch.aminmax(position_ids)).tolist()
    if low < 0 or high >= max_pos:
        raise ValueError(f"position_ids span [{low}, {high}], outside the table's rows [0, {max_pos - 1}]")


# Note [The range check in the kernel]
#     On a GPU a host read of the positions' range would wait for every queued kernel and stall the
#     launch queue on every call (29-36 us per call on the H200; RoPE's packed forward at Llama-3-8B
#     shapes 0.155 ms instead of 0.090), and checking on the device before the launch took three
#     small kernels. So the rotation kernel checks each token's position as it loads it: a token
#     outside the table fails a device-side assertion (``tl.device_assert``, which Triton compiles in
#     only for a kernel jitted with ``debug=True``; debug also checks int32 arithmetic for overflow,
#     and this kernel's index arithmetic is all int64), reads row 0 instead of past the table, and
#     writes nothing. The assertion stops the stream at the next synchronisation ("device-side assert
#     triggered", as torch's own indexing gives for HF's ``cos[position_ids]``; the message names
#     position_ids), also on every replay of a captured CUDA graph, and a CUDA context that has
#     asserted can run and read nothing more, so the tokens rotated beside it are never seen. Before,
#     the kernel cleared a one-element flag and ``torch._assert_async`` on it followed the launch:
#     two more launches and an allocation per call (a flag and an assertion: 13-16 us of host time on
#     the H200, forward and backward each). Triton's interpreter never compiles the assertion, and
#     on the CPU the check before the launch raises ValueError first. Tests that read what the
#     kernel wrote past a bad position, and the benchmark that times what the assertion costs, compile
#     it without the assertion (``without_range_assertion``).


@contextlib.contextmanager
def without_range_assertion():
    """While the block runs, the rotation kernel is compiled (and launched) without its range check's
    device assertion (Note [The range check in the kernel]); the comparisons that keep a bad
    position's token unread and unwritten stay. Under Triton's interpreter the assertion is never
    compiled: nothing changes. It switches the one kernel every caller launches: not for concurrent
    use."""
    if not hasattr(_rope_kernel, "debug"):  # an interpreted kernel
        yield
        return
    before = _rope_kernel.debug
    _rope_kernel.debug = False
    try:
        yield
    finally:
        _rope_kernel.debug = before


def _require_safe_memory(Q, K, cos, sin, position_ids, writes: bool) -> None:
    """The checks that read memory, in the ops, on real tensors (kernels/_library.py, Note [What the
    wrapper checks, and what the op checks]): Q and K, when written in place, own their elements and
    share no memory with each other or the other arguments; then every position names a table row."""
    if writes:
        read = {"cos": cos, "sin": sin} | ({} if position_ids is None else {"position_ids": position_ids})
        _checks.require_unaliased({"Q": Q, "K": K}, read)
    if position_ids is not None:
        require_positions_in_table(position_ids, cos.shape[0])  # last: the one check that reads data


def _per_token(position_ids: torch.Tensor | None, Q: torch.Tensor) -> torch.Tensor | None:
    """(batch, seq) positions; the ops also take the contract's (1, seq) row and broadcast it (the
    wrapper has already: no second view on every call)."""
    if position_ids is None or position_ids.shape == (Q.shape[0], Q.shape[2]):
        return position_ids
    return position_ids.expand(Q.shape[0], Q.shape[2])


# --- the custom ops (kernels/_library.py) --------------------------------------------------------


def _rotate_in_place(Q, K, cos, sin, position_ids) -> None:
    """The op's body: the memory checks, then one launch rotating Q and K where they lie."""
    position_ids = _per_token(position_ids, Q)
    _require_safe_memory(Q, K, cos, sin, position_ids, writes=True)
    if Q.numel() > 0:
        _launch(Q, Q, K, K, cos, sin, position_ids, backward=False)


@custom_op("rope", mutates_args=("Q", "K"))
def _rope_op(Q: torch.Tensor, K: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             position_ids: Optional[torch.Tensor]) -> None:
    """Rotates Q and K in place (the schema marks both mutated, which bumps their versions)."""
    _rotate_in_place(Q, K, cos, sin, position_ids)


@_rope_op.register_fake
def _(Q, K, cos, sin, position_ids):
    return None


@custom_op("rope_rotated")
def _rope_rotated_op(Q: torch.Tensor, K: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     position_ids: Optional[torch.Tensor], backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K rotated into new tensors (``backward``: rotated back, sin negated): the functional
    form torch.compile uses (Note [RoPE under torch.compile]); its own gradient is the same op with
    ``backward`` flipped."""
    position_ids = _per_token(position_ids, Q)
    _require_safe_memory(Q, K, cos, sin, position_ids, writes=False)
    Q_out, K_out = torch.empty_like(Q), torch.empty_like(K)
    if Q.numel() > 0:
        _launch(Q, Q_out, K, K_out, cos, sin, position_ids, backward=backward)
    return Q_out, K_out


@_rope_rotated_op.register_fake
def _(Q, K, cos, sin, position_ids, backward):
    return torch.empty_like(Q), torch.empty_like(K)


def _rotated_setup_context(ctx, inputs, output):
    _, _, cos, sin, position_ids, backward = inputs
    ctx.save_for_backward(cos, sin, position_ids)
    ctx.backward = backward


def _rotated_backward(ctx, dQ, dK):
    cos, sin, position_ids = ctx.saved_tensors
    dQ_in, dK_in = _rope_rotated_op(dQ, dK, cos, sin, position_ids, not ctx.backward)
    return dQ_in, dK_in, None, None, None, None


_rope_rotated_op.register_autograd(_rotated_backward, setup_context=_rotated_setup_context)


@calls(_rope_op)
def rope(Q: torch.Tensor, K: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate Q and K by their tokens' positions, IN PLACE, as HF's apply_rotary_pos_emb.

    Q: (batch, n_heads, seq, head_dim), K: (batch, n_kv_heads, seq, head_dim), any strides, one
    dtype; cos, sin: (max_pos, head_dim) tables as HF builds them, fp32 or the model dtype (rows are
    cast to Q's dtype, as HF does); position_ids: (batch, seq) table rows per token (packed
    sequences restart inside a row), int64 or int32, (1, seq) for the same positions in every row,
    None for 0..seq-1 in every row; their range is checked on every call (on the CPU a ValueError
    before the launch; on a GPU by the kernel itself as it loads each position, without a host sync:
    its device-side assertion stops the stream, and no token outside the table is read or written).

    Returns Q and K themselves, rotated. Q and K are overwritten (``CLOBBERS["rope"]``): a caller who
    still needs the originals passes copies; they must not share memory with each other or any other
    argument, nor be expanded (ValueError). Differentiable in Q and K. The op
    ``kernel_oracle::rope`` (mutating Q and K); under torch.compile, ``rope_rotated`` and a copy
    back (Note [RoPE under torch.compile]).
    """
    position_ids = _validate(Q, K, cos, sin, position_ids)
    if tracing():
        return _rope_traced(Q, K, cos, sin, position_ids)
    # In eager mode the op's body runs without the dispatcher (kernels/_library.py, Note [Eager
    # autograd skips the dispatcher]); the op itself has no autograd (an op that mutates may not
    # have a formula), and the node below records the rotation instead.
    for name, t in (("Q", Q), ("K", K)):
        _require_rotatable_in_place(name, t)
    _rotate_in_place(Q, K, cos, sin, position_ids)
    if not (torch.is_grad_enabled() and (Q.requires_grad or K.requires_grad)):
        for t in (Q, K):  # no node to record: only tell autograd the memory changed, as the op would
            if not t.is_inference():  # (a view shares its base's counter; inference tensors keep none)
                increment_version(t)
        return Q, K
    buffers, placements = _buffers(Q, K)
    RotatedInPlace.apply(placements, cos, sin, position_ids, *buffers)  # marking them dirty bumps their versions
    # Reading grad_fn re-derives a view's history from its base now: torch (2.11 to 2.13) crashes
    # when register_hook is the first to touch a view whose base was written in place.
    Q.grad_fn, K.grad_fn  # noqa: B018
    return Q, K


def _rope_traced(Q, K, cos, sin, position_ids):
    """What torch.compile traces (Note [RoPE under torch.compile]): rotated copies, written back into
    Q and K by copy_, which autograd and functionalization both understand."""
    Q_rotated, K_rotated = _rope_rotated_op(Q, K, cos, sin, position_ids, False)
    Q.copy_(Q_rotated)
    K.copy_(K_rotated)
    return Q, K
