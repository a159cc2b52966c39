"""The differential engine: one case through HF, the truth and an implementation, then the verdict.

``run_case`` is the unit everything else uses (tests, report, repro). For one case it

1. makes the arguments (spec.make_args) and evaluates, with autograd, HF's maths in the test dtype,
   the truth (the same maths on float64 copies) and the reordered form (the verdict's floor);
2. runs the implementation on guarded copies in the case's layout, with its own allocations
   re-homed into NaN-poisoned guarded buffers, through a residual graph ``z = r + op(x)`` so that
   the gradient it receives is shared with another branch (``r``), as in a real residual stream;
3. judges the forward outputs and every gradient (compare.judge) and collects the aliasing
   findings that this one run can prove (the main-run checks of docs/design.md §4; the checks that
   need graphs of their own live in aliasing.py).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch.autograd.gradcheck import GradcheckError

from oracle import kernel_coverage, noise
from oracle.noise.saved import storage_dtype
from oracle.cases import autotune
from oracle.declare import reference as R
from oracle.cases import scale
from oracle.cases import Case
from oracle.verdict import ELEMENT_BOUND, Noise, Spread, TensorVerdict, describe_element, judge, summation_noise
from oracle.declare.implementations import Implementation
from oracle.checks import exact as exact_check
from oracle.checks import overflow
from oracle.checks import rounding
from oracle.checks.memory import BROADCAST_ROWS, CONTIGUOUS, GuardedTensor, Layout, Snapshot, bits, copy_into, rehomed_allocations
from oracle.declare.registry import SPECS
from oracle.declare.spec import OpSpec, upstream_gradient
from oracle.engine.watchdog import time_limit
from oracle.errors import CaseError, CaseFailed, Float64Failure  # noqa: F401 - raised here


# Cases run in this process, by (op, dtype): the test session prints them at the end.
CASES_RUN: Counter = Counter()
# What those cases and the aliasing checks covered, for the session's coverage summary:
# ("case", op, variant, dtype, layout, grad_layout, values, past tiles) and ("check", op, variant, dtype, check).
COVERAGE: Counter = Counter()
# Called with (case, impl name[, check]) before a case or an aliasing check runs and (None, None)
# after, so that a crash that kills the process can still be traced to it (the pytest plugin
# records it for xdist); and so that an autotuned kernel runs the one config the case's number
# chooses, in every tool (oracle/cases/autotune.py, Note [One config per case]).
INFLIGHT_HOOKS: list[Callable] = [autotune.case_hook, kernel_coverage.case_hook]


@dataclass(frozen=True)
class Finding:
    """One aliasing or memory-safety problem: which check, what was corrupted and where."""

    check: str  # snapshot | incoming-gradient | views | guard-band | unwritten | version-counter | retain-graph | ...
    tensor: str
    phase: str  # forward | backward
    message: str
    index: list[int] | None = None
    expected: float | None = None
    found: float | None = None

    def describe(self) -> str:
        where = f" at {self.index}" if self.index is not None else ""
        values = f" (expected {self.expected!r}, found {self.found!r})" if self.expected is not None else ""
        return f"[{self.check}] {self.tensor} during {self.phase}{where}: {self.message}{values}"


@dataclass
class CaseResult:
    case: Case
    impl: str
    status: str  # pass | fail | error | crash | skipped
    verdicts: list[TensorVerdict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    scope: str = ""  # what was judged, where not the whole case (a case at scale)
    generic: dict = field(default_factory=dict)  # reference ops the derived model's generic rule modelled
    configs: list[str] = field(default_factory=list)  # "kernel: config" of each autotuned launch the case ran
    # Where HF's reference goes non-finite and what to change there (oracle/checks/overflow.py), on a
    # case whose verdicts have reference_nonfinite; "" on the others.
    reference_diagnosis: str = ""
    hints: list[str] = field(default_factory=list)  # what the implementation may declare (saved_room_hint)

    def __repr__(self) -> str:  # the case and the outcome; explain() has the rest
        return f"CaseResult({self.status}: {self.case.summary()} [impl {self.impl}])"

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def declaration_problems(self) -> list[str]:
        """Where HF's reference is non-finite and the float64 truth a number (compare.py, Note [A
        reference that overflows]): the declaration's problem, whatever the implementation did. The
        last names the statement to change, where the diagnosis ran (oracle/checks/overflow.py)."""
        out = []
        for v in self.verdicts:
            if v.reference_nonfinite:
                w = v.reference_worst
                advice = "" if self.reference_diagnosis else f": it overflows in {v.dtype}; compute it in a wider dtype"
                out.append(f"HF's reference gives {v.reference_nonfinite} non-finite value(s) in {v.name} where the "
                           f"float64 truth is a {v.dtype} number (first at {w['index']}: HF {w['h']:.6g}, truth "
                           f"{w['t']:.6g}){advice}. There the implementation is judged against the truth alone")
        if out and self.reference_diagnosis:
            out.append(self.reference_diagnosis)
        return out

    @property
    def repro(self) -> str:
        return repro_command(self.case, self.impl)

    def to_dict(self) -> dict:
        return {"case": self.case.record(), "impl": self.impl, "status": self.status,
                "verdicts": [v.to_dict() for v in self.verdicts], "findings": [asdict(f) for f in self.findings],
                "error": self.error, "seconds": self.seconds, "repro": self.repro, "configs": self.configs,
                "reference_diagnosis": self.reference_diagnosis,
                "hints": self.hints,
                "explain": self.explain()}

    def explain(self) -> str:
        """A failure report a person can act on: the case, metrics per tensor, findings, the repro."""
        lines = [f"{self.status.upper()}: {self.case.summary()}  [impl {self.impl}]"]
        maths = {v.maths for v in self.verdicts}
        if maths:
            lines.append("  maths: " + ("exact (the implementation declares EXACT_MATHS)" if maths == {"exact"} else
                                        "fast (Triton's tl.exp granted; oracle/noise/rounding.py, Note [Fast maths])"))
        if self.scope:
            lines.append(f"  {self.scope}")
        if self.configs:  # oracle/cases/autotune.py: the case's number chose them; its rerun runs them again
            lines.append("  autotuned, judged with: " + "; ".join(self.configs))
        for v in self.verdicts:
            mark = "ok  " if v.passed else "FAIL"
            lines.append(
                f"  {mark} {v.name:6s} max|k-t|={v.max_abs:.3g} bound={v.bound:.3g} ratio={v.error_ratio:.3g} "
                f"bit-identical={v.bit_identical:.1%} ulp(max/p99)={v.ulp_max:.0f}/{v.ulp_p99:.0f}"
                + (f" element={v.element_max:.2g}/{v.element_bound:g} typical={v.mean_error:.2g}/{v.mean_bound:.2g}"
                   if v.element_max is not None else "")
                + (f" spread={v.spread:.2g}/{v.spread_bound:.2g}" if v.spread is not None else "")
                + (f" against-the-truth={v.reference_element_max:.2g}/{ELEMENT_BOUND:g} ({v.reference_nonfinite} where HF "
                   "is non-finite)" if v.reference_nonfinite and v.reference_element_max is not None else "")
                + (" [passed in the room of fast maths: exp as Triton's tl.exp]" if v.needed_fast_maths else "")
                + (" [passed in the room of activations saved in the input dtype]" if v.needed_saved_room else "")
                + ("" if v.passed else f"\n       {v.reason}" + (
                    f"; largest |k-t| {describe_element(**v.worst)}" if v.worst and not v.nonfinite_mismatches else "")))
        lines += [f"  declaration problem: {problem}" for problem in self.declaration_problems]
        lines += [f"  hint: {hint}" for hint in self.hints]
        if self.generic:
            ops = ", ".join(f"{op} ({n} call{'s' if n > 1 else ''})" for op, n in sorted(self.generic.items()))
            lines.append(f"  noise: the derived model had no exact rule for {ops}: they were modelled by its generic "
                         "rule, finite differences over the whole op, not first-order exact (oracle/noise/rules.py, "
                         "Note [Propagation rules])")
        lines += ["  " + f.describe() for f in self.findings]
        if self.error:
            lines.append("  " + self.error.strip().replace("\n", "\n  "))
        lines.append(f"  rerun: {self.repro}")
        return "\n".join(lines)




def repro_command(case: Case, impl: str, check: str | None = None, float64: bool = False) -> str:
    """The one command that reruns exactly this case (and, given, one aliasing check of it, or its
    float64 check)."""
    from oracle.declare.registry import ORIGINS

    check_flag = f" --check {check}" if check else " --float64" if float64 else ""
    module = f" --op-module {shlex.quote(ORIGINS[case.op])}" if case.op in ORIGINS else ""
    return f"python -m oracle.repro --impl {shlex.quote(impl)}{module}{check_flag} {shlex.quote(case.to_json())}"


# --- references ---------------------------------------------------------------------------------


@dataclass
class Evaluation:
    outputs: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {**self.outputs, **self.grads}


def evaluate(spec: OpSpec, fn, args: dict, upstream: dict | None, compute=None) -> Evaluation:
    """Run ``fn`` (a reference or an implementation) with autograd on fresh leaves for the
    differentiable arguments; ``upstream`` maps output names to the gradients fed to backward."""
    leaves = {name: args[name].detach().clone().requires_grad_() for name in spec.differentiable}
    call = functools.partial(fn, compute=compute) if compute is not None else fn
    with torch.enable_grad():
        outs = spec.call(call, {**args, **leaves})
        outputs = dict(zip(spec.outputs, outs))
        grads = {}
        if leaves and upstream is not None:
            names = [n for n in spec.outputs if outputs[n].requires_grad]
            got = torch.autograd.grad([outputs[n] for n in names], list(leaves.values()),
                                      [upstream[n] for n in names], allow_unused=True)
            grads = {"d" + n: g if g is not None else torch.zeros_like(leaves[n]) for n, g in zip(leaves, got)}
    return Evaluation({n: t.detach() for n, t in outputs.items()}, grads)


def _whole(name: str, t: torch.Tensor) -> torch.Tensor:
    return t


@dataclass
class Prepared:
    """A case's arguments (the implementation runs on these) and the three reference evaluations it
    is judged against: of the whole case, or of the slice ``compared_part`` takes from each compared
    tensor (a case at scale, oracle/cases/scale.py)."""

    args: dict
    upstream: dict[str, torch.Tensor]
    hf: Evaluation
    truth: Evaluation
    reordered: Evaluation
    sum_noise: dict[str, float]  # compare.summation_noise per summed tensor
    element_noise: dict[str, torch.Tensor]  # the spec's noise model per compared tensor
    order_noise: dict[str, torch.Tensor]  # the part of it another summation order moves
    compared_part: Callable[[str, torch.Tensor], torch.Tensor] = _whole  # (name, implementation's tensor) -> judged part
    scope: str = ""  # what was judged, where not the whole case
    noise_model: str = "derived"  # which model judged it: derived, or the spec's own (noise_rule)
    maths: str = "fast"  # the maths granted (Note [Fast maths]); fast: element_noise includes its room
    exact_noise: dict | None = None  # with fast maths: the noise without that room
    typical_room: dict | None = None  # with fast maths: its typical size, for the distribution judgement
    generic: dict = field(default_factory=dict)  # NoiseModels.generic: ops the derived model modelled generically
    spread: dict = field(default_factory=dict)  # compare.Spread per sum's output, where the derived model judges
    # The (args, upstream) HF's evaluation of each compared tensor was made on (a slice's, or the
    # whole case's for a gradient summed over every program): the rounding contract re-evaluates them.
    reference_inputs: tuple[dict, dict] = ({}, {})
    summed_inputs: dict[str, tuple[dict, dict]] = field(default_factory=dict)
    nudged: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # name -> (down, up)
    # SAVED_IN_INPUT_DTYPE granted (oracle/noise/saved.py): element_noise and reordered include that
    # rounding point; ``unsaved`` holds, per tensor, the noise and other order without it.
    saved: bool = False
    unsaved: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)

    def judge(self, name: str, got: torch.Tensor) -> TensorVerdict:
        """The verdict on one compared tensor of an implementation (compare.judge); with fast maths,
        whether it needed that room to pass, and with saved activations rounded, whether it needed
        that rounding point."""
        def verdict(noise, room, reordered=None):
            noise = Noise(sum_noise=self.sum_noise.get(name, 0.0), element_noise=noise,
                          order_noise=self.order_noise.get(name), hf_room=self.noise_model == "derived",
                          typical_room=room.get(name) if room else None, spread=self.spread.get(name))
            return judge(name, self.compared_part(name, got), self.hf.tensors()[name], self.truth.tensors()[name],
                         noise, self.reordered.tensors().get(name) if reordered is None else reordered)

        granted = verdict(self.element_noise[name], self.typical_room)
        needed = self.maths == "fast" and granted.passed and self.exact_noise is not None and \
            not verdict(self.exact_noise[name], None).passed
        needed_saved = granted.passed and name in self.unsaved and \
            not verdict(*self.unsaved[name][:1], self.typical_room, self.unsaved[name][1]).passed
        return dataclasses.replace(granted, maths=self.maths, needed_fast_maths=needed, needed_saved_room=needed_saved)

    def inputs_of(self, name: str) -> tuple[dict, dict]:
        return self.summed_inputs.get(name, self.reference_inputs)

    def nudged_evaluations(self, spec: OpSpec, names: list[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """HF's maths on the inputs of each of ``names``, with every rounding to a 16-bit dtype moved
        down and up (oracle/checks/rounding.py): (down, up) per name, evaluated once a case, and
        backward only where a gradient is asked."""
        for inputs in {id(self.inputs_of(n)): self.inputs_of(n) for n in names if n not in self.nudged}.values():
            asked = [n for n in names if self.inputs_of(n) is inputs and n not in self.nudged]
            args, upstream = inputs
            backward = upstream if any(n not in spec.outputs for n in asked) else None
            steps = rounding.ROUNDING_ULPS
            down, up = (_nudged_evaluation(spec, args, backward, moved) for moved in (-steps, steps))
            self.nudged.update({n: (down[n], up[n]) for n in asked})
        return {n: self.nudged[n] for n in names}


def _nudged_evaluation(spec: OpSpec, args: dict, upstream: dict | None, steps: int) -> dict[str, torch.Tensor]:
    with rounding.Nudged(steps):
        return evaluate(spec, spec.reference, args, upstream).tensors()


def prepare(spec: OpSpec, case: Case, device, upstream_fn=upstream_gradient, maths: str = "fast",
            saved: bool = False) -> Prepared:
    """``maths``: the rule the noise model grants (an implementation's ``maths(op)``, Note [Fast maths]);
    ``saved``: whether it grants the backward's saved activations rounded to the input's dtype (an
    implementation's ``saves_in_input_dtype(op)``, Note [Saved activations in the input dtype])."""
    args = spec.make_args(case, device)
    saved = saved and spec.differentiable and storage_dtype(args) is not None
    if scale.judged_on_a_slice(spec, case):
        return _prepare_on_a_slice(spec, case, args, upstream_fn, maths, saved)
    # HF's forward gives the outputs' shapes and dtypes, from which the upstream gradients are drawn.
    forward = evaluate(spec, spec.reference, args, None)
    upstream = {name: upstream_fn(case, name, out) for name, out in forward.outputs.items()} if spec.differentiable else {}
    return _references(spec, case, args, upstream, maths, saved)


NOISE_MODELS = ("declared", "derived")


def noise_rule() -> str:
    """Which noise model judges (ORACLE_NOISE_MODEL): ``derived`` everywhere (the default), the
    hand-written models switched off (oracle/noise, Note [The derived noise model]); or ``declared``,
    each spec's hand-written one where it has one and the derived one otherwise."""
    rule = os.environ.get("ORACLE_NOISE_MODEL", "derived")
    if rule not in NOISE_MODELS:
        raise ValueError(f"ORACLE_NOISE_MODEL must be one of {', '.join(NOISE_MODELS)}, got {rule!r}")
    return rule


def uses_derived_noise(spec: OpSpec) -> bool:
    return not spec.noise or noise_rule() == "derived"


@dataclass
class NoiseModels:
    """What judges a case: per compared tensor the element and order noise, which model they come
    from, the maths granted, the noise without fast maths' room (None under exact maths), and the
    derived model when one was derived (it also holds the exact truth)."""

    element: dict
    order: dict
    model: str
    maths: str
    exact: dict | None
    derived: noise.DerivedModel | None

    @property
    def typical_room(self) -> dict | None:
        return self.derived.fast_typical if self.maths == "fast" and self.derived is not None else None

    @property
    def spread(self) -> dict[str, Spread]:
        """compare.py, Note [The spread judgement]: the sums' outputs among the judged tensors, with
        the derived model's noise of each, where that model judges."""
        if self.model != "derived":
            return {}
        terms = self.derived.sum_terms
        return {name: Spread(noise_of / noise.NOISE_SDS, terms[name]) for name, noise_of in self.element.items()
                if name in terms}

    @property
    def generic(self) -> dict[str, int]:
        """The reference's ops that the derived model had no exact rule for (noise/rules.py, the
        generic rule), where that model judges."""
        return dict(self.derived.generic) if self.model == "derived" and self.derived is not None else {}


def _merged(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {name: max(a.get(name, 0), b.get(name, 0)) for name in {**a, **b}}


def noise_models(spec: OpSpec, args: dict, upstream: dict, derive: Callable[[], noise.DerivedModel],
                 maths: str = "fast", names: tuple[str, ...] | None = None) -> NoiseModels:
    """The one place a case's noise models are chosen and built, for the compared tensors ``names``
    (default: all of them): the derived model (``derive()``, called where it is needed: it judges,
    it gives a declared reference its exact truth, or fast maths' room is granted) or the spec's
    hand-written one (``spec.noise`` on ``args`` and ``upstream``), with fast maths' room on top
    unless ``maths`` is exact. A case's tensors take the whole case's derived model; a gradient
    summed over every program of a case at scale takes one derived chunk by chunk (noise.derive_summed)."""
    names = tuple(spec.compared() if names is None else names)
    derived = derive() if uses_derived_noise(spec) or not spec.takes_compute or maths == "fast" else None
    if uses_derived_noise(spec):
        exact, order = _pick(derived.noise, names), _pick(derived.order, names)
        if maths == "exact":
            return NoiseModels(exact, order, "derived", maths, None, derived)
        return NoiseModels(_pick(derived.fast_noise, names), order, "derived", maths, exact, derived)
    hand = {name: spec.noise[name](args, upstream) for name in names}
    order_noise = {name: spec.order_noise[name](args, upstream) for name in names if name in spec.order_noise}
    if maths == "exact":
        return NoiseModels(hand, order_noise, "declared", maths, None, derived)
    # fast maths' room, derived where the reference calls exp or divides, on top of the hand-written model
    extra = derived.fast_extra
    granted = {name: hand[name] + extra[name] for name in names}
    return NoiseModels(granted, order_noise, "declared", maths, hand, derived)


def _pick(tensors: dict, names: tuple[str, ...]) -> dict:
    return {name: tensors[name] for name in names}


def _compute(case: Case) -> torch.dtype:
    """The dtype a case computes and accumulates in: float32 for the 16-bit dtypes and float32."""
    return torch.float64 if case.dtype == "float64" else torch.float32


def _references(spec: OpSpec, case: Case, args: dict, upstream: dict, maths: str = "fast",
                saved: bool = False) -> Prepared:
    hf = evaluate(spec, spec.reference, args, upstream)
    models = noise_models(spec, args, upstream,
                          lambda: noise.derive(spec, args, upstream, _compute(case), records=True, saved=saved), maths)
    derived = models.derived
    if spec.takes_compute:
        truth = evaluate(spec, spec.reference, {k: R.upcast(v) for k, v in args.items()},
                         {k: R.upcast(v) for k, v in upstream.items()}, compute=torch.float64)
    else:  # a declared reference may hard-code its upcasts: the shadow evaluation's exact values
        truth = _split(spec, derived.truth)
    if spec.reference_reordered is not None:
        reordered = evaluate(spec, spec.reference_reordered, args, upstream, compute=torch.float32)
    else:
        reordered = _split(spec, noise.reordered(spec, args, upstream, _compute(case), saved=saved))
    sum_noise = {name: summation_noise(*terms(args, upstream), _compute(case))
                 for name, terms in spec.summed.items()}
    return Prepared(args, upstream, hf, truth, reordered, sum_noise, models.element, models.order,
                    noise_model=models.model, maths=models.maths, exact_noise=models.exact,
                    typical_room=models.typical_room, generic=models.generic, spread=models.spread,
                    reference_inputs=(args, upstream), saved=saved,
                    unsaved=_unsaved(spec, case, args, upstream, maths) if saved else {})


def _unsaved(spec: OpSpec, case: Case, args: dict, upstream: dict, maths: str) -> dict:
    """Per gradient, the noise and the other order without the saved activations' rounding: what
    the verdict would have been without SAVED_IN_INPUT_DTYPE (Prepared.judge)."""
    models = noise_models(spec, args, upstream, lambda: noise.derive(spec, args, upstream, _compute(case)), maths)
    reordered = noise.reordered(spec, args, upstream, _compute(case)) if spec.reference_reordered is None else {}
    return {name: (models.element[name], reordered.get(name)) for name in spec.grad_names() if name in models.element}


def _split(spec: OpSpec, tensors: dict[str, torch.Tensor]) -> Evaluation:
    return Evaluation({n: tensors[n] for n in spec.outputs},
                      {n: tensors[n] for n in spec.grad_names() if n in tensors})


def _prepare_on_a_slice(spec: OpSpec, case: Case, args: dict, upstream_fn, maths: str = "fast",
                        saved: bool = False) -> Prepared:
    """A case at scale (oracle/cases/scale.py, Note [Judging a case at scale]): the references of a slice of
    its programs, and of the gradients summed over all of them; the implementation gets it whole."""
    programs = spec.programs
    with torch.no_grad():
        outputs = spec.call(spec.reference, args)  # shapes and dtypes, as above, without a graph
    upstream = {name: upstream_fn(case, name, out) for name, out in zip(spec.outputs, outputs)} \
        if spec.differentiable else {}
    del outputs
    count, largest = programs.size(case)
    index = scale.compared_programs(count, largest // count, case.seed)
    prepared = _references(spec, case, programs.args(args, index),
                           {name: programs.tensor(t, index) for name, t in upstream.items()}, maths, saved)
    for name in programs.summed_gradients:
        _summed_over_every_program(spec, case, prepared, name, args, upstream)
    prepared.args, prepared.upstream = args, upstream
    prepared.compared_part = lambda name, t: t if name in programs.summed_gradients else programs.tensor(t, index)
    prepared.scope = scale.describe_slice(spec, len(index), count)
    return prepared


def _summed_over_every_program(spec: OpSpec, case: Case, prepared: Prepared, name: str, args: dict,
                               upstream: dict) -> None:
    """A gradient summed over every program, judged whole: HF's autograd over the whole case, the
    truth summed in float64 chunk by chunk, and the noise models (the spec's take the whole case in
    bounded memory; the derived one is derived chunk by chunk)."""
    prepared.hf.grads[name] = evaluate(spec, spec.reference, args, upstream).grads[name]
    prepared.summed_inputs[name] = (args, upstream)
    count, largest = spec.programs.size(case)

    def parts():
        for index in scale.chunks(count, largest // count):
            yield spec.programs.args(args, index), {k: spec.programs.tensor(v, index) for k, v in upstream.items()}

    models = noise_models(spec, args, upstream,
                          lambda: noise.derive_summed(spec, name, parts(), _compute(case), prepared.saved),
                          prepared.maths, names=(name,))
    derived = models.derived
    if spec.takes_compute:
        truth = None
        for part_args, part_upstream in parts():
            part = evaluate(spec, spec.reference, {k: R.upcast(v) for k, v in part_args.items()},
                            {k: R.upcast(v) for k, v in part_upstream.items()}, compute=torch.float64).grads[name]
            truth = part if truth is None else truth + part
        prepared.truth.grads[name] = truth
    else:
        prepared.truth.grads[name] = derived.truth[name]
    if spec.reference_reordered is not None:
        prepared.reordered.grads[name] = evaluate(spec, spec.reference_reordered, args, upstream,
                                                  compute=torch.float32).grads[name]
    else:
        prepared.reordered.grads[name] = noise.reordered_summed(spec, name, parts(), _compute(case), prepared.saved)
    prepared.element_noise[name] = models.element[name]
    prepared.unsaved.pop(name, None)  # at scale the summed gradient's "needed" is not derived twice
    if name in models.order:
        prepared.order_noise[name] = models.order[name]
    if prepared.exact_noise is not None:
        prepared.exact_noise[name] = models.exact[name]
    if prepared.typical_room is not None:
        prepared.typical_room[name] = models.typical_room[name]
    prepared.generic = _merged(prepared.generic, models.generic)
    prepared.spread.pop(name, None)
    prepared.spread.update(models.spread)
    if name in spec.summed:
        prepared.sum_noise[name] = summation_noise(*spec.summed[name](args, upstream), _compute(case))


# --- the implementation -------------------------------------------------------------------------


@dataclass
class ImplRun:
    outputs: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]
    findings: list[Finding]


def place(spec: OpSpec, case: Case, args: dict, device, guards: list,
          sources: dict | None = None) -> tuple[dict, dict]:
    """Guarded copies of the arguments (the layout args in the case's layout), and the leaves their
    differentiable ones are copied from: gradients arrive on the leaves, layout-independent.
    ``sources`` gives tensors to copy from (and differentiate into) instead of fresh leaves."""
    placed, leaves = {}, {}
    sources = sources or {}
    for name, value in args.items():
        if not isinstance(value, torch.Tensor):
            placed[name] = value
            continue
        where = spec.layout_of(case.layout, tuple(value.shape)) if name in spec.layout_args else CONTIGUOUS
        home = GuardedTensor(value.shape, value.dtype, device, where, label=name)
        guards.append(home)
        if name in spec.differentiable:
            leaves[name] = sources[name] if name in sources else value.detach().clone().requires_grad_()
            with torch.enable_grad():
                placed[name] = home.tensor.copy_(leaves[name])  # differentiable: the view joins the graph
        else:
            with torch.no_grad():
                placed[name] = home.tensor.copy_(value)
    return placed, leaves


def run_impl(spec: OpSpec, case: Case, impl: Implementation, prepared: Prepared, device) -> ImplRun:
    fn, clobbers = impl.op(spec.name), impl.clobbers(spec.name)
    findings: list[Finding] = []
    guards: list[GuardedTensor] = []
    args, leaves = place(spec, case, prepared.args, device, guards)
    watched = Snapshot({n: t for n, t in args.items() if isinstance(t, torch.Tensor) and n not in clobbers})

    # The residual branch is built before the op so that its backward runs after the op's (autograd
    # runs later-created nodes first): it then consumes the shared gradient after the op has had
    # every chance to corrupt it, as a residual stream's earlier layers do.
    residuals = _residual_branches(prepared, device) if spec.differentiable else {}
    with torch.enable_grad(), rehomed_allocations() as allocations:
        outs = spec.call(fn, args)
    if len(outs) != len(spec.outputs):
        raise TypeError(f"{spec.name} returned {len(outs)} value(s), the contract has {len(spec.outputs)}")
    outputs = dict(zip(spec.outputs, outs))
    findings += changed_findings(watched, "snapshot", "forward", "changed but is not declared in CLOBBERS")
    findings += _buffers_hold(spec, args, outputs, clobbers)
    forward_bits = {n: bits(t).clone() for n, t in outputs.items()}

    grads = {}
    if spec.differentiable:
        forward = _Forward(outputs, residuals, leaves, guards, allocations)
        grads, backward_findings = _backward(spec, case, forward, prepared, device)
        findings += backward_findings
        findings += changed_findings(watched, "snapshot", "backward", "changed during backward but is not declared in CLOBBERS")

    findings += guard_findings("guard-band", guards + allocations)
    # Judge the outputs as they were right after forward (backward must not have touched them either).
    for name, out in outputs.items():
        if not torch.equal(bits(out), forward_bits[name]):
            findings.append(Finding("snapshot", name, "backward", "output changed during backward"))
    return ImplRun({n: t.detach() for n, t in outputs.items()}, grads, findings)


def _residual_branches(prepared: Prepared, device) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per output, a leaf r and the non-leaf branch a = r * 1 that the output is added to."""
    branches = {}
    for name, like in prepared.upstream.items():  # an output's gradient has its shape and dtype
        leaf = torch.zeros(like.shape, dtype=like.dtype, device=device, requires_grad=True)
        with torch.enable_grad():
            branches[name] = (leaf, leaf * 1)
    return branches


def gradient_layout(spec: OpSpec, case: Case, shape: tuple[int, ...]) -> Layout:
    """Where the gradient of an output sits in memory, per the case's gradient layout."""
    if case.grad_layout == "broadcast":
        return BROADCAST_ROWS
    return spec.layout_of(case.grad_layout, shape)


@dataclass(frozen=True)
class _Forward:
    """What an implementation's forward leaves for its backward: the op's outputs, each output's
    residual branch (a leaf, and the branch added to the output), the leaves its gradients arrive
    on, and the guarded memory backward adds to (the guarded homes, the op's rehomed allocations)."""

    outputs: dict[str, torch.Tensor]
    residuals: dict[str, tuple[torch.Tensor, torch.Tensor]]
    leaves: dict[str, torch.Tensor]
    guards: list[GuardedTensor]
    allocations: list


def _backward(spec: OpSpec, case: Case, forward: _Forward, prepared: Prepared, device):
    """Backward through ``z = a + y`` per output: the op and the residual branch a share one
    incoming gradient, which must stay intact for a."""
    findings = []
    outputs, residuals = forward.outputs, forward.residuals
    upstream, captured, residual_expects = {}, [], {}
    for name, out in outputs.items():
        if not out.requires_grad:
            raise TypeError(f"{spec.name}'s output {name} does not require grad; autograd cannot reach the inputs")
        home = GuardedTensor(out.shape, out.dtype, device, gradient_layout(spec, case, tuple(out.shape)), label="d" + name)
        forward.guards.append(home)
        with torch.no_grad():
            upstream[name] = copy_into(home.tensor, prepared.upstream[name])
            # what the residual branch must receive: the gradient as handed, in the branch's dtype (an
            # output whose dtype differs from HF's gets its gradient rounded to that dtype, no corruption)
            residual_expects[name] = bits(upstream[name].to(prepared.upstream[name].dtype)).clone()
        out.register_hook(lambda g, n=name: captured.append((n, g, bits(g).clone())))
    incoming = Snapshot({"d" + n: t for n, t in upstream.items()})
    with torch.enable_grad():
        z = [residuals[n][1] + outputs[n] for n in outputs]
        with rehomed_allocations() as more:
            torch.autograd.backward(z, [upstream[n] for n in outputs])
        forward.allocations.extend(more)
    findings += changed_findings(incoming, "incoming-gradient", "backward", "the gradient handed to backward was overwritten")
    for name, grad, before in captured:
        if not torch.equal(bits(grad), before):
            findings.append(Finding("incoming-gradient", "d" + name, "backward",
                                    "the gradient tensor autograd passed in was modified"))
    for name, (leaf, _) in residuals.items():
        if leaf.grad is None or not torch.equal(bits(leaf.grad), residual_expects[name]):
            findings.append(Finding("incoming-gradient", f"residual branch of {name}", "backward",
                                    "the other branch sharing the gradient received a corrupted gradient"))
    grads = {"d" + n: (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))
             for n, leaf in forward.leaves.items()}
    return grads, findings


def guard_findings(check: str, homes: list[GuardedTensor]) -> list[Finding]:
    """A Finding for every sentinel byte outside a guarded tensor that a write changed."""
    return [Finding(check, home.label, "forward/backward", f"write outside the tensor's elements at offset {hit['position']}",
                    expected=hit["expected"], found=hit["found"]) for home in homes for hit in home.corruption()]


def changed_findings(snapshot: Snapshot, check: str, phase: str, message: str) -> list[Finding]:
    """A Finding for every snapshotted tensor whose bits changed, with the first changed element."""
    return [Finding(check, name, phase, f"{message} ({d['count']} element(s))", d["index"], d["expected"], d["found"])
            for name, d in snapshot.changed().items()]


def _buffers_hold(spec: OpSpec, args: dict, outputs: dict, clobbers: set[str]) -> list[Finding]:
    """A raw kernel that declares it overwrites a buffer (CLOBBERS) promises that buffer holds its
    result; one that returns fresh tensors and declares nothing is just as valid."""
    out = []
    for output, buffer in spec.buffers_hold_outputs.items():
        if buffer not in clobbers:
            continue
        got, home = outputs[output], args[buffer]
        same = got.data_ptr() == home.data_ptr() and got.shape == home.shape and got.stride() == home.stride()
        if not same or not torch.equal(bits(got), bits(home)):
            out.append(Finding("buffers", buffer, "forward", f"does not hold {output} as the contract says"))
    return out


# --- the verdict --------------------------------------------------------------------------------


def judge_all(spec: OpSpec, prepared: Prepared, run: ImplRun,
              exact: dict[str, exact_check.Promise] | None = None) -> tuple[list[TensorVerdict], list[Finding]]:
    """Every compared tensor's verdict, and the findings beside it: elements left unwritten, and
    where ``exact`` names a tensor (-> who promises which contract), every element that breaks it."""
    got = {**run.outputs, **run.grads}
    hf = prepared.hf.tensors()
    verdicts, findings = [], []
    for name in spec.compared():
        k, h = prepared.compared_part(name, got[name]), hf[name]
        phase = "forward" if name in spec.outputs else "backward"
        verdicts.append(prepared.judge(name, got[name]))
        unwritten = int((k.isnan() & ~h.to(k.device).isnan()).sum()) if k.shape == h.shape else 0
        if unwritten:
            findings.append(Finding("unwritten", name, phase,
                                    f"{unwritten} element(s) NaN where HF has a number (unwritten, read from poisoned memory?)"))
        if name in (exact or {}) and k.shape == h.shape:
            findings += _broken_promise(spec, prepared, name, phase, k, h, exact[name])
    return verdicts, findings


def _broken_promise(spec: OpSpec, prepared: Prepared, name: str, phase: str, k: torch.Tensor, h: torch.Tensor,
                    promise: exact_check.Promise) -> list[Finding]:
    """The exact check's finding on one tensor (oracle/checks/exact.py, Note [Two contracts]), if any."""
    if promise.contract == exact_check.BITS:
        differs = exact_check.first_difference(k, h)
        if differs is None:
            return []
        count, index, expected, found = differs
        message = exact_check.explained(count, k.numel(), promise.by)
        return [Finding("exact", name, phase, message, index, expected, found)]
    args, upstream = prepared.inputs_of(name)
    if not rounding.rounds_to_sixteen_bit(h, *args.values(), *upstream.values()):
        return []  # no rounding to a 16-bit dtype: nothing the contract promises
    down, up = prepared.nudged_evaluations(spec, [name])[name]
    outside = exact_check.outside_rounding(k, h, down, up, prepared.truth.tensors()[name])
    if outside is None:
        return []
    count, index, expected, found, low, high = outside
    return [Finding("exact", name, phase, exact_check.explained_rounding(count, k.numel(), promise.by, low, high),
                    index, expected, found)]


def saved_room_hint(spec: OpSpec, case: Case, prepared: Prepared, run: ImplRun, verdicts: list[TensorVerdict]) -> list[str]:
    """Where a gradient fails only by what rounding the backward's saved activations to the input's
    dtype costs, say so and name the declaration (oracle/noise/saved.py, Note [Saved activations in
    the input dtype]): the one thing a correct kernel that recomputes from a stored 16-bit output
    must add. Judged again only on a failure, never at scale."""
    failed = [v.name for v in verdicts if not v.passed and v.name in run.grads]
    dtype = storage_dtype(prepared.args)
    if not failed or prepared.saved or prepared.scope or dtype is None or prepared.noise_model != "derived":
        return []
    granted = _references(spec, case, prepared.args, prepared.upstream, prepared.maths, saved=True)
    passing = [name for name in failed if granted.judge(name, run.grads[name]).passed]
    if not passing:
        return []
    dtype = str(dtype).removeprefix("torch.")
    return [f"{', '.join(passing)} would pass if the backward read its saved activations rounded to {dtype}: "
            "if the implementation saves an activation in the input's dtype and recomputes from it, declare that "
            "(SAVED_IN_INPUT_DTYPE, docs/reference/verdict.md); if it does not, it loses precision HF's float32 "
            "backward keeps"]


def exact_tensors(spec: OpSpec, impl: Implementation) -> dict[str, exact_check.Promise]:
    """The tensors a case holds to a contract, each with who promised which (Note [Exact bits])."""
    return {name: exact_check.Promise(f"the op {spec.name}" if spec.exact.get(name) == contract else
                                      f"{impl.name}'s EXACT", contract) for name, contract in impl.exact(spec).items()}


def _reference_diagnosis(spec: OpSpec, prepared: Prepared, verdicts: list[TensorVerdict]) -> str:
    """Where HF's reference is non-finite and the truth a number, the statement of it to change,
    found on the arguments HF's evaluation of that tensor was given; "" elsewhere (it runs the
    reference again: only on the rare case that has the problem)."""
    flagged = next((v for v in verdicts if v.reference_nonfinite), None)
    return "" if flagged is None else overflow.diagnose(spec, prepared.inputs_of(flagged.name)[0])


def run_case(spec: OpSpec | str, case: Case, impl: Implementation, device,
             observe: Callable[[ImplRun], None] | None = None, prepared: Prepared | None = None) -> CaseResult:
    """Everything for one case; exceptions become an 'error' result carrying the traceback.
    ``observe`` sees the implementation's outputs and gradients (mutation testing compares bits);
    ``prepared``, the case's references made before for this implementation's grants (``prepare``
    with its maths and saved activations), which mutation testing reuses across mutants."""
    spec = SPECS[spec] if isinstance(spec, str) else spec
    start = time.perf_counter()
    result = CaseResult(case, impl.name, "pass")
    if impl.op(spec.name) is None:
        result.status = "skipped"
        result.error = f"{impl.name} has no {spec.name}"
        return result
    for hook in INFLIGHT_HOOKS:
        hook(case, impl.name)
    try:
        # a case at scale waits for its GPU before its time starts (oracle/cases/scale.py)
        with scale.one_at_a_time(spec, case, device), time_limit(case.summary()):
            if prepared is None:
                prepared = prepare(spec, case, device, maths=impl.maths(spec.name),
                                   saved=impl.saves_in_input_dtype(spec.name))
            run = run_impl(spec, case, impl, prepared, device)
            if observe is not None:
                observe(run)
            result.verdicts, unwritten = judge_all(spec, prepared, run, exact_tensors(spec, impl))
            result.findings = run.findings + unwritten
            result.hints = saved_room_hint(spec, case, prepared, run, result.verdicts)
            result.scope, result.generic = prepared.scope, prepared.generic
            result.reference_diagnosis = _reference_diagnosis(spec, prepared, result.verdicts)
            del prepared, run  # before the GPU goes to the next case at scale
        if result.findings or not all(v.passed for v in result.verdicts):
            result.status = "fail"
    except Exception:  # noqa: BLE001 - any exception is a result to report, with its traceback
        result.status = "error"
        result.error = traceback.format_exc(limit=-6)
    result.configs = autotune.chosen()
    for hook in INFLIGHT_HOOKS:
        hook(None, None)
    CASES_RUN[(case.op, case.dtype)] += 1
    COVERAGE[("case", case.op, case.variant, case.dtype, case.layout, case.grad_layout, case.values,
              spec.long(case))] += 1
    result.seconds = time.perf_counter() - start
    return result


# --- float64 ------------------------------------------------------------------------------------



def float64_notes(spec: OpSpec, case: Case, impl_name: str) -> list[str]:
    """What a float64 failure carries beside torch's own message: the case, the command that reruns
    the check, and what an implementation without a float64 path declares instead."""
    return [f"float64 check of {case.summary()}  [impl {impl_name}]",
            f"rerun: {repro_command(case, impl_name, float64=True)}",
            f"an implementation without a float64 path declares it: NO_FLOAT64 = {{{spec.name!r}}} skips this check"]


# Note [The float64 forward]
#     An autograd op's float64 outputs are held to the truth (the same maths on float64 copies; not
#     HF's outputs, which may compute in float32 whatever the input, as HF's RMSNorm does) to within
#     FLOAT64_RTOL of each element plus FLOAT64_ATOL of the output's largest magnitude. The room is
#     float64 rounding's, with a wide margin: float64 cases are small (the built-in ones' sums have
#     a few dozen terms, a declared op's default case one short row), and another order of a sum of
#     n terms, or a fused multiply-add, moves it by at most about n * 2^-53 of its terms' scale:
#     1e-14 at a hundred terms. 1e-10 is ten thousand times that, and 600 times under what a single
#     float32 intermediate costs (2^-24, 6e-8). The absolute part scales with the output, not with
#     1: an element that cancels to near zero carries the rounding of terms of the output's size
#     (a rotation, a norm where x is near 0), and a fixed atol would be lax for small outputs and
#     strict for large ones. An output HF gives in a narrower dtype (a declared op's fixed float32
#     one) is granted its rounding to that dtype too. gradcheck alone cannot see a forward that is
#     smoothly wrong: it differentiates the implementation's own forward. RMSNorm given eps rounded
#     to float32 is 1e-8 off on rows of tiny values (the op's third float64 case), and gradcheck
#     passes it.
FLOAT64_RTOL = 1e-10
FLOAT64_ATOL = 1e-12  # times the output's largest finite magnitude


def _float64_forward_failure(name: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> str | None:
    """Where an output of a float64 case is farther from the truth ``want`` than float64 rounding
    allows (Note [The float64 forward]), plus its rounding to ``dtype``, HF's dtype of it where that
    is narrower (a declared op's fixed float32 output): a line saying which output, where, how far
    and the room; None where within."""
    if got.dtype != dtype or got.shape != want.shape:
        return f"{name} is {got.dtype} of shape {list(got.shape)} where HF's is {dtype} of shape {list(want.shape)}"
    got, want = got.detach().to(want.device, torch.float64), want.detach().to(torch.float64)
    finite = want[torch.isfinite(want)]
    atol = FLOAT64_ATOL * (finite.abs().max().item() if finite.numel() else 0.0)
    rtol = FLOAT64_RTOL + (torch.finfo(dtype).eps / 2 if dtype != torch.float64 else 0.0)
    error = (got - want).abs()
    allowed = rtol * want.abs() + atol
    within = (got == want) | (got.isnan() & want.isnan()) | (error <= allowed)
    if bool(within.all()):
        return None
    how_far = torch.where(within, -1.0, (error / allowed).nan_to_num(nan=torch.inf))
    worst = tuple(int(i) for i in torch.unravel_index(how_far.argmax(), want.shape))
    g, w = got[worst].item(), want[worst].item()
    off = f"{abs(g - w) / abs(w):.3g} relative" if w else f"{abs(g - w):.3g}"
    return (f"{name} differs from the float64 truth at {int((~within).sum())} of {want.numel()} elements (the "
            f"worst at {list(worst)}: {g!r} where the truth is {w!r}, off by {off}; allowed: rtol {rtol:.3g} "
            f"plus atol {atol:.3g}, {FLOAT64_ATOL:g} of its largest magnitude: float64 rounding, where a float32 "
            f"intermediate is 1e-7 off)")


def check_float64(spec: OpSpec, case: Case, impl: Implementation, device) -> None:
    """The float64 check of one float64 case. For an op under autograd: its forward outputs against
    the float64 truth (Note [The float64 forward]), then torch.autograd.gradcheck of its backward
    against finite differences; for a kernel outside autograd (the raw SwiGLU ones), its outputs
    against HF's formula, to within float64 rounding (a float32 intermediate is 1e-7 off; 1e-10 is
    allowed). Raises Float64Failure where it fails; an exception the implementation raises keeps its
    type and carries float64_notes."""
    try:
        prepared = prepare(spec, case, device)
        if not spec.differentiable:
            args, _ = place(spec, case, prepared.args, device, [])
            got = dict(zip(spec.outputs, spec.call(impl.op(spec.name), args)))
            for name, want in prepared.hf.outputs.items():
                try:
                    torch.testing.assert_close(got[name], want, rtol=1e-10, atol=1e-12)
                except AssertionError as exc:
                    raise Float64Failure("\n".join(
                        [f"{name} differs from HF's formula in float64 (allowed: rtol 1e-10, atol 1e-12, float64 "
                         f"rounding; a float32 intermediate is 1e-7 off): {str(exc).strip()}"]
                        + float64_notes(spec, case, impl.name))) from None
            return
        leaves = [prepared.args[n].detach().clone().requires_grad_() for n in spec.differentiable]

        def fn(*values):
            # Fresh guarded copies in the case's layout each call: in-place ops (rope) must not rotate
            # gradcheck's own inputs, and the copies carry the gradient back to them.
            args, _ = place(spec, case, prepared.args, device, [], sources=dict(zip(spec.differentiable, values)))
            return spec.call(impl.op(spec.name), args)

        outputs = dict(zip(spec.outputs, fn(*leaves)))
        for name, want in prepared.truth.outputs.items():
            wrong = _float64_forward_failure(name, prepared.compared_part(name, outputs[name]), want,
                                             prepared.hf.outputs[name].dtype)
            if wrong:
                raise Float64Failure("\n".join([wrong] + float64_notes(spec, case, impl.name)))
        try:
            torch.autograd.gradcheck(fn, leaves, fast_mode=True)
        except GradcheckError as exc:
            message = str(exc).strip().splitlines()
            raise Float64Failure("\n".join(
                [f"gradcheck: the backward disagrees with finite differences in float64: {message[0]}"]
                + [f"  {line}" for line in message[1:4]]
                + float64_notes(spec, case, impl.name))) from None
    except Float64Failure:
        raise
    except Exception as exc:  # the implementation's own error, e.g. a float32-only kernel given float64
        for note in float64_notes(spec, case, impl.name):
            exc.add_note(note)
        raise
