"""A rounding point an implementation may add: what its forward saves for the backward, stored in the
case's 16-bit dtype.

Note [Saved activations in the input dtype]
    A kernel that keeps memory low saves an activation in the input's dtype and recomputes from it
    in the backward: the output y of a norm, from which normed = y / w, rather than x and a float32
    statistic. That is a legitimate design, and its backward carries one more rounding than the
    reference's autograd chain, which reads its saved float32 values whole. Where a gradient is a
    small difference of large terms (a norm's dX when the incoming gradient lies along the output,
    cases.GRAD_KINDS "aligned"), that rounding moves the result by many of its own ULPs, and a
    verdict made from a float32 reference fails the kernel; a reference written in the input dtype
    instead gives it the room but overflows where eager 16-bit code does. So the harness takes one
    reference, written as HF writes it (float32 inside), and an implementation declares the rounding
    point it adds (``SAVED_IN_INPUT_DTYPE``): then the derived noise model evaluates the reference's
    backward on its saved tensors rounded to the case's 16-bit dtype.

    Concretely, under autograd's saved-tensor hooks, every floating tensor the reference's forward
    saves for its backward that is wider than the case's 16-bit dtype is rounded to it when the
    backward reads it: in variance mode its rounding's variance is added to what it carries (so the
    gradients' noise holds that rounding's effect, propagated through the backward's own sensitivity),
    in nearest mode it is rounded to nearest (HF's other valid order rounds there too), in sample mode
    it is rounded at random. The arguments themselves, and views of them, are left whole: parameters
    are what a kernel reads back, not activations it stored. A case without a 16-bit tensor gets
    nothing: its activations are stored in its own dtype.

    This grants exactly the extra rounding, not a looser verdict: a backward that also rounds a row
    sum to 16 bits (tests/sixteen_bit_norm.py) is still judged against the room of one rounding of
    each saved value, propagated. Whether a case needed the room is recorded per tensor
    (``needed_saved_room``), so a run says where the declaration is used.
"""

from __future__ import annotations

import contextlib

import torch

from oracle.noise import rounding
from oracle.noise.shadow import Evaluation, Shadow


def storage_dtype(args: dict) -> torch.dtype | None:
    """The case's 16-bit dtype (the narrowest floating argument's, where narrower than float32)."""
    widths = {value.dtype: torch.finfo(value.dtype).bits for value in args.values()
              if isinstance(value, torch.Tensor) and value.is_floating_point()}
    narrowest = min(widths, key=widths.get, default=None)
    return narrowest if narrowest is not None and widths[narrowest] < 32 else None


def _storages(shadows: dict) -> set[int]:
    return {s.value.untyped_storage().data_ptr() for s in shadows.values()}


def saved_activations(args: dict, shadows: dict, state: Evaluation):
    """Autograd's saved-tensor hooks that round what the reference's forward saves (Note [Saved
    activations in the input dtype]); a no-op context where the case has no 16-bit dtype."""
    dtype = storage_dtype(args)
    if dtype is None:
        return contextlib.nullcontext()
    arguments = _storages(shadows)
    bits = torch.finfo(dtype).bits

    def pack(saved: torch.Tensor) -> torch.Tensor:
        if not isinstance(saved, Shadow) or not saved.dtype.is_floating_point or \
                torch.finfo(saved.dtype).bits <= bits or saved.value.untyped_storage().data_ptr() in arguments:
            return saved
        if state.mode == "variance":
            var = saved.var + rounding.rounding_variance(saved.value, dtype)
            return Shadow(saved.value, saved.dtype, var, saved.order, saved.fast, saved.own)
        if state.mode == "nearest":
            return Shadow(rounding.to_nearest(saved.value, dtype), saved.dtype)
        return Shadow(rounding.rounding_sample(saved.value, dtype, state.generator), saved.dtype)

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda packed: packed)
