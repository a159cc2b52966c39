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

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import rounding
from .shadow import Shadow, evaluating

NOISE_SDS = 3.0  # standard deviations of the rounding noise that count as "what HF's maths can do"


@dataclass
class DerivedModel:
    truth: dict[str, torch.Tensor]
    variance: dict[str, torch.Tensor]  # of each tensor's error, its own last rounding left out
    order_variance: dict[str, torch.Tensor]  # the part of it from sums' accumulation
    generic: dict[str, int]
    fast_variance: dict[str, torch.Tensor] = None  # what fast GPU maths adds (rounding.py, Note [Fast maths])

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
    def order(self) -> dict[str, torch.Tensor]:
        return {name: v.clamp(min=0).sqrt() for name, v in self.order_variance.items()}


def shadow_run(spec, fn: Callable, args: dict, upstream: dict, mode: str, compute: torch.dtype | None = None,
               seed: int = 0) -> tuple[dict[str, Shadow], dict]:
    """``fn`` (with the contract's signature) on shadows of the arguments, forward and backward for
    the upstream gradients: every compared tensor as a Shadow, and the ops modelled generically."""
    fn = _with_compute(fn, compute)
    with evaluating(mode, seed) as state, torch.enable_grad():
        shadows = {name: Shadow.of(value, requires_grad=name in spec.differentiable)
                   for name, value in args.items() if isinstance(value, torch.Tensor) and value.is_floating_point()}
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


def derive(spec, args: dict, upstream: dict, compute: torch.dtype | None = None) -> DerivedModel:
    """Note [The derived noise model] for one case's arguments and upstream gradients."""
    tensors, generic = shadow_run(spec, spec.reference, args, upstream, "variance", compute)
    return DerivedModel({name: t.value.detach() for name, t in tensors.items()},
                        {name: t.var - t.own for name, t in tensors.items()},
                        {name: t.order for name, t in tensors.items()}, generic,
                        {name: t.fast for name, t in tensors.items()})


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


def derive_summed(spec, name: str, parts, compute: torch.dtype | None = None) -> DerivedModel:
    """The derived model of a tensor summed over independent parts of a case (RMSNorm's dW over
    chunks of rows at scale): each part derived on its own, their variances added, and the
    accumulation of the parts' sums (Note [Accumulation]) on top. ``parts``: (args, upstream) pairs."""
    truth = variance = order = fast = squares = None
    count, generic = 0, {}
    for args, upstream in parts:
        part = derive(spec, args, upstream, compute)
        t, v, o, f = part.truth[name], part.variance[name], part.order_variance[name], part.fast_variance[name]
        truth, variance, order, fast = (t, v, o, f) if truth is None else \
            (truth + t, variance + v, order + o, fast + f)
        squares = t * t if squares is None else squares + t * t
        count += 1
        generic = {**generic, **part.generic}
    acc = rounding.accumulation_variance(truth, squares, count, _nominal_dtype(spec, name, args))
    return DerivedModel({name: truth}, {name: variance + acc}, {name: order + acc}, generic, {name: fast})


def _nominal_dtype(spec, name: str, args: dict) -> torch.dtype:
    """A gradient's dtype: its argument's."""
    return args[name[1:]].dtype


def reordered(spec, args: dict, upstream: dict, compute: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The reference in another valid order (shadow.py's nearest mode), in its nominal dtypes."""
    tensors, _ = shadow_run(spec, spec.reference, args, upstream, "nearest", compute)
    return {name: t.value.to(t.dtype) for name, t in tensors.items()}


def reordered_summed(spec, name: str, parts, compute: torch.dtype | None = None) -> torch.Tensor:
    """The nearest-mode value of a tensor summed over independent parts: each part's, added up."""
    total, dtype = None, None
    for args, upstream in parts:
        tensors, _ = shadow_run(spec, spec.reference, args, upstream, "nearest", compute)
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
