"""The derived noise model: the verdict's per-element noise (compare.py, Note [The per-element
judgement]) computed from a reference's own maths, so that an op needs no hand-written error analysis.

Note [The derived noise model]
    The reference's forward and autograd backward run on shadow tensors (shadow.py, Note [Shadow
    evaluation]): every aten op evaluated exactly in float64, beside the variance of the rounding
    error its nominal evaluation would carry there, propagated to first order (rules.py) with each
    sum's accumulation modelled over random orders (rounding.py, Note [Accumulation]). That
    variance is exactly what Monte Carlo arithmetic estimates from many randomly rounded runs
    (``sample`` mode runs one), computed in closed form: no sampling noise, one run.

    For each compared tensor it gives

    - ``truth``: the exact values (the float64 truth, whatever casts the reference hard-codes);
    - ``noise``: NOISE_SDS standard deviations of the error the reference's roundings leave there,
      without the last rounding of the tensor itself (the verdict's ulp(t) is that one);
    - ``order``: one standard deviation of the part its sums' accumulation contributes, what another
      valid order moves (the distribution judgement's order noise, a typical size, not a bound);
    - ``generic``: ops that only the generic finite-difference rule modelled (rules.py).

    The per-element judgement allows an error of ELEMENT_BOUND = 2 scales: with NOISE_SDS = 3, six
    standard deviations of HF's own rounding noise where that noise dominates one ULP.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from oracle.noise import rounding
from oracle.noise.saved import saved_activations
from oracle.noise.shadow import Shadow, evaluating

NOISE_SDS = 3.0  # standard deviations of the rounding noise that count as "what HF's maths can do"


@dataclass
class DerivedModel:
    truth: dict[str, torch.Tensor]
    variance: dict[str, torch.Tensor]  # of each tensor's error, its own last rounding left out
    order_variance: dict[str, torch.Tensor]  # the part of it from sums' accumulation
    generic: dict[str, int]
    fast_variance: dict[str, torch.Tensor] = None  # what fast GPU maths adds (rounding.py, Note [Fast maths])
    accumulated: dict = None  # per tensor that is a sum's output (or its view or cast): rules.Accumulated

    @property
    def noise(self) -> dict[str, torch.Tensor]:
        """Exact maths: held to the library's accuracy."""
        return {name: NOISE_SDS * v.clamp(min=0).sqrt() for name, v in self.variance.items()}

    @property
    def fast_noise(self) -> dict[str, torch.Tensor]:
        """Fast maths granted (the default rule)."""
        return {name: NOISE_SDS * (v + self.fast_variance[name]).clamp(min=0).sqrt() for name, v in self.variance.items()}

    @property
    def fast_typical(self) -> dict[str, torch.Tensor]:
        """The typical size of fast maths' error alone (the mean of |N(0, var)|: sd sqrt(2/pi)), which
        the distribution judgement lets an implementation's typical error exceed HF's by."""
        return {name: (2 * v.clamp(min=0) / math.pi).sqrt() for name, v in self.fast_variance.items()}

    @property
    def fast_extra(self) -> dict[str, torch.Tensor]:
        """What fast maths adds to a hand-written model: NOISE_SDS standard deviations of it alone."""
        return {name: NOISE_SDS * v.clamp(min=0).sqrt() for name, v in self.fast_variance.items()}

    @property
    def sum_terms(self) -> dict[str, int]:
        """Per tensor that is a sum's output (derived with ``records``): how many terms each element
        sums (compare.py, Note [The spread judgement])."""
        return {name: int(record.terms) for name, record in (self.accumulated or {}).items()}

    @property
    def order(self) -> dict[str, torch.Tensor]:
        return {name: v.clamp(min=0).sqrt() for name, v in self.order_variance.items()}


def shadow_run(spec, args: dict, upstream: dict, mode: str, compute: torch.dtype | None = None,
               records: bool = False, saved: bool = False) -> tuple[dict[str, Shadow], dict]:
    """The spec's reference on shadows of the arguments in ``mode`` (shadow.py's ``evaluating``),
    forward and backward for the upstream gradients: every compared tensor as a Shadow, and the ops
    modelled generically. (Sample mode's draws go through ``evaluating`` itself, with a seed.) With
    ``saved``, the backward reads what the forward saved rounded to the case's 16-bit dtype (Note
    [Saved activations in the input dtype])."""
    fn = _with_compute(spec.reference, compute)
    with evaluating(mode, records=records) as state, torch.enable_grad():
        shadows = {name: Shadow.of(value, requires_grad=name in spec.differentiable)
                   for name, value in args.items() if isinstance(value, torch.Tensor) and value.is_floating_point()}
        with saved_activations(args, shadows, state) if saved else contextlib.nullcontext():
            outputs = dict(zip(spec.outputs, spec.call(fn, {**args, **shadows})))
        tensors = dict(outputs)
        if spec.differentiable and upstream:
            names = [n for n in spec.outputs if outputs[n].requires_grad]
            leaves = [shadows[n] for n in spec.differentiable]
            grads = torch.autograd.grad([outputs[n] for n in names], leaves,
                                        [Shadow.of(upstream[n]) for n in names], allow_unused=True)
            for name, leaf, grad in zip(spec.differentiable, leaves, grads):
                tensors["d" + name] = grad if grad is not None else Shadow.of(torch.zeros(leaf.shape, dtype=leaf.dtype,
                                                                                         device=leaf.device))
    return tensors, dict(state.generic)


def derive(spec, args: dict, upstream: dict, compute: torch.dtype | None = None, records: bool = False,
           saved: bool = False) -> DerivedModel:
    """Note [The derived noise model] for one case's arguments and upstream gradients; with
    ``records``, ``accumulated`` holds what the accumulation of each tensor that is a sum's output came
    from (Note [One long sum]); with ``saved``, Note [Saved activations in the input dtype]."""
    tensors, generic = shadow_run(spec, args, upstream, "variance", compute, records=records, saved=saved)
    return DerivedModel({name: t.value.detach() for name, t in tensors.items()},
                        {name: t.var - t.own for name, t in tensors.items()},
                        {name: t.order for name, t in tensors.items()}, generic,
                        {name: t.fast for name, t in tensors.items()},
                        {name: t.accumulated for name, t in tensors.items()
                         if t.accumulated is not None and t.accumulated.holds(t.value)})


def coherence(samples: list[torch.Tensor], truth: torch.Tensor, variance: torch.Tensor) -> float:
    """How much larger the rounding noise of a long computation is than its propagated variance
    says: at least 1, the square root of the samples' mean square error over the propagated mean
    variance, pooled over the tensor's elements.

    Note [Coherent errors]
        The propagation (rules.py) takes the errors of different elements as independent. Within
        one op that holds well (tests/test_noise.py), but a deep computation (a model, a training
        run) carries errors that many elements share: a norm's 1/rms error scales its whole row, and
        the next matmul sums that row coherently, where independent errors would partly cancel.
        Monte Carlo samples of the same computation (shadow.py's sample mode) carry those
        correlations exactly; pooled over a tensor's elements, a few of them measure the factor by
        which the propagated noise falls short, and the noise is scaled by it."""
    finite = torch.isfinite(truth) & torch.isfinite(variance)
    spread = torch.stack([(s - truth).square() for s in samples]).mean(0)
    finite &= torch.isfinite(spread)
    propagated = float(variance[finite].sum())
    measured = float(spread[finite].sum())
    return max(1.0, (measured / propagated) ** 0.5) if propagated > 0 else 1.0


# Note [One long sum]
#     A gradient summed over every program of a case at scale (RMSNorm's dW over 131072 rows) is
#     derived part by part (chunks of programs, in bounded memory), and must get the model the whole
#     case's derivation would give it: one sum over all its terms, whose accumulation (rounding.py,
#     Note [Accumulation]) is that of n terms in a random order. The parts' own models hold the
#     accumulation of a sum over their own terms; adding those up, then one accumulation over the
#     parts' sums, models a two-level sum, whose accumulation is smaller (for terms of mixed signs its
#     variance is about 1/chunks + 1/terms per chunk of one long sum's). Before this note dW's order
#     noise at scale was 0.28 to 0.74 of the whole case's (median 0.49); on tests/test_scale.py's
#     cases of 10 chunks, 0.49 (bf16) and 0.45 (fp32) at the median element, and fp32's whole
#     variance, mostly accumulation there, 0.53 (sd).
#
#     So each sum's output carries what its accumulation came from (rules.Accumulated: per element
#     the exact sum, the sum of its terms' squares and their count), through views and casts, in the
#     parts' derivations only (``records``: elsewhere nothing is kept beyond the variances). Where
#     the tensor is such an output in every part, the parts' own accumulations are taken out and that
#     of one sum over every part's terms (sums, squares and counts added) put in: the whole case's,
#     to rounding. This takes the tensor's last sum to be the one over the programs, as a summed
#     gradient's is (autograd reducing a broadcast weight). Otherwise (not a sum's output in every
#     part: a sum then a product, an in-place write) the two-level model stands.
#     tests/test_scale.py compares the two derivations on cases derived both ways.


def derive_summed(spec, name: str, parts, compute: torch.dtype | None = None, saved: bool = False) -> DerivedModel:
    """The derived model of a tensor summed over independent parts of a case (RMSNorm's dW over
    chunks of rows at scale): each part derived on its own and their variances added, with the
    accumulation of one sum over every part's terms (Note [One long sum]). ``parts``: (args,
    upstream) pairs."""
    truth = variance = order = fast = squares = whole = None
    own = 0.0  # the parts' own accumulations, taken out of variance and order
    count, generic, joinable = 0, {}, True
    for args, upstream in parts:
        part = derive(spec, args, upstream, compute, records=True, saved=saved)
        t, v, o, f = part.truth[name], part.variance[name], part.order_variance[name], part.fast_variance[name]
        record = part.accumulated.get(name)
        if record is not None:
            accumulated = record.variance()
            v, o, own = v - accumulated, o - accumulated, own + accumulated
        if record is None or not joinable:
            joinable = False
        else:
            whole = record if whole is None else whole.joined(record)
            joinable = whole is not None
        truth, variance, order, fast = (t, v, o, f) if truth is None else \
            (truth + t, variance + v, order + o, fast + f)
        squares = t * t if squares is None else squares + t * t
        count += 1
        generic = {**generic, **part.generic}
    if joinable:  # one sum over every part's terms
        acc = whole.variance()
    else:  # not one sum's output in every part: each part's accumulation, then one over the parts' sums
        acc = own + rounding.accumulation_variance(truth, squares, count, _nominal_dtype(spec, name, args))
    return DerivedModel({name: truth}, {name: variance + acc}, {name: order + acc}, generic, {name: fast},
                        {name: whole} if joinable else {})


def _nominal_dtype(spec, name: str, args: dict) -> torch.dtype:
    """A gradient's dtype: its argument's."""
    return args[name[1:]].dtype


def reordered(spec, args: dict, upstream: dict, compute: torch.dtype | None = None,
              saved: bool = False) -> dict[str, torch.Tensor]:
    """The reference in another valid order (shadow.py's nearest mode), in its nominal dtypes."""
    tensors, _ = shadow_run(spec, args, upstream, "nearest", compute, saved=saved)
    return {name: t.value.to(t.dtype) for name, t in tensors.items()}


def reordered_summed(spec, name: str, parts, compute: torch.dtype | None = None, saved: bool = False) -> torch.Tensor:
    """The nearest-mode value of a tensor summed over independent parts: each part's, added up."""
    total, dtype = None, None
    for args, upstream in parts:
        tensors, _ = shadow_run(spec, args, upstream, "nearest", compute, saved=saved)
        part = tensors[name]
        total, dtype = (part.value if total is None else total + part.value), part.dtype
    return total.to(dtype)


def _with_compute(fn: Callable, compute: torch.dtype | None) -> Callable:
    """The built-in references take the dtype HF upcasts to as ``compute``; declared ones do not."""
    if compute is None:
        return fn
    try:
        takes = "compute" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        return fn
    return lambda *a, **k: fn(*a, **k, compute=compute)
