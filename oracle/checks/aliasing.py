"""Checks that need graphs of their own: aliasing and determinism (docs/design.md §4). The engine's main run already
covers snapshots (1), the shared incoming gradient of a residual (2), guard bands (4) and
poisoned allocations (5); here are the rest, each returning Findings that say what was corrupted
and where:

- ``sum-loss``       (2) ``op(x).sum()``: backward receives a stride-0 expanded gradient.
- ``shared-input``   (2) each input also feeds another op that saved it, whose backward runs after
                         the op's: that consumer's gradient and the summed input gradient stay right.
- ``retain-graph``       a second backward is bit-identical to the first, or raises.
- ``views``          (3) the inputs are views into one fused buffer (QKV, gate/up); the bystander
                         block beside them (V) must stay untouched and the results right.
- ``version-counter``(6) a clobbered argument saved by another op: autograd must raise, never
                         hand back a silently wrong gradient.
- ``deterministic``      forward and backward run twice on identical inputs give identical bits
                         (on a GPU, what atomics and races change between runs).
- ``compile``            inside torch.compile(fullgraph=True), the same bits as in eager mode;
                         a custom op's schema against CLOBBERS, and opcheck (oracle/checks/compile.py).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import torch

from oracle.checks import compile as compile_check
from oracle.cases import Case
from oracle.verdict import bit_identical
from oracle.engine import COVERAGE, INFLIGHT_HOOKS, Finding, changed_findings, guard_findings, place, prepare
from oracle.declare.implementations import Implementation
from oracle.checks.memory import GuardedTensor, Snapshot, bits, rehomed_allocations
from oracle.declare.spec import OpSpec, fill, generator
from oracle.engine.watchdog import time_limit


def _verdict_findings(check: str, spec: OpSpec, got: dict, prepared, names) -> list[Finding]:
    out = []
    for name in names:
        v = prepared.judge(name, got[name])
        if not v.passed:
            out.append(Finding(check, name, "forward" if name in spec.outputs else "backward",
                               f"wrong result: {v.reason}", v.worst.get("index"), v.worst.get("h"), v.worst.get("k")))
    return out


def sum_loss(spec: OpSpec, case: Case, impl: Implementation, device) -> list[Finding]:
    """Backward of ``sum(op(x))``: every output's gradient is a stride-0 expanded ones tensor."""
    prepared = prepare(spec, case, device, upstream_fn=lambda c, n, out: torch.ones_like(out),
                       maths=impl.maths(spec.name), saved=impl.saves_in_input_dtype(spec.name))
    guards: list[GuardedTensor] = []
    args, leaves = place(spec, case, prepared.args, device, guards)
    with torch.enable_grad(), rehomed_allocations() as allocations:
        outs = spec.call(impl.op(spec.name), args)
        sum(out.sum() for out in outs).backward()
    got = {"d" + n: leaf.grad for n, leaf in leaves.items()}
    return _verdict_findings("sum-loss", spec, got, prepared, spec.grad_names()) + \
        guard_findings("sum-loss", guards + allocations)


def shared_input(spec: OpSpec, case: Case, impl: Implementation, device) -> list[Finding]:
    """Each differentiable input also feeds another consumer built before the op, ``(x * c).sum()``,
    which saved x for c's gradient. Its backward runs after the op's (autograd runs later nodes
    first), so an op that scribbles on x during backward hands c a wrong gradient; and x's
    gradient, summed over both consumers, must still be right."""
    # Inputs the op may overwrite are check 6's business: saving them must make autograd raise.
    shared = [n for n in spec.differentiable if n not in impl.clobbers(spec.name)]
    if not shared:
        return []
    prepared = prepare(spec, case, device, maths=impl.maths(spec.name), saved=impl.saves_in_input_dtype(spec.name))
    guards: list[GuardedTensor] = []
    args, leaves = place(spec, case, prepared.args, device, guards)
    findings = []
    with torch.enable_grad():
        # c = 0: c's gradient is x itself, and x's gradient is the op's dX plus exactly 0.
        consumers = {n: torch.zeros_like(leaves[n]).requires_grad_() for n in shared}
        x_before = {n: args[n].detach().clone() for n in shared}
        other = sum((args[n] * c).sum() for n, c in consumers.items())
        outs = dict(zip(spec.outputs, spec.call(impl.op(spec.name), args)))
        torch.autograd.backward([other] + [outs[n] for n in spec.outputs],
                                [torch.ones((), dtype=other.dtype, device=device)]
                                + [prepared.upstream[n] for n in spec.outputs])
    for name, c in consumers.items():
        if not bool(bit_identical(c.grad, x_before[name]).all()):  # NaN-aware: x * 1 may canonicalise a NaN
            findings.append(Finding("shared-input", f"the other consumer of {name}", "backward",
                                    f"its gradient is not {name}: {name} changed after forward, before that "
                                    "consumer's backward read it"))
    got = {"d" + n: leaf.grad for n, leaf in leaves.items()}
    return findings + _verdict_findings("shared-input", spec, got, prepared, spec.grad_names()) + \
        guard_findings("shared-input", guards)


def retain_graph(spec: OpSpec, case: Case, impl: Implementation, device) -> list[Finding]:
    """Two backwards through one graph: the second must equal the first bit for bit, or raise (or the
    first, asked to retain the graph) with a message."""
    prepared = prepare(spec, case, device)
    args, leaves = place(spec, case, prepared.args, device, [])
    with torch.enable_grad():
        outs = spec.call(impl.op(spec.name), args)
        upstream = [prepared.upstream[n] for n in spec.outputs]
        try:  # refusing to retain the graph at all (torch.compile's donated buffers) is a refusal too
            first = torch.autograd.grad(outs, list(leaves.values()), upstream, retain_graph=True)
            second = torch.autograd.grad(outs, list(leaves.values()), upstream)
        except RuntimeError as exc:
            if str(exc).strip():
                return []  # a clear refusal is allowed
            return [Finding("retain-graph", "graph", "backward", "second backward raised without a message")]
    return [Finding("retain-graph", "d" + name, "backward",
                    "a second backward (retain_graph=True) returned different values than the first")
            for name, a, b in zip(leaves, first, second) if not torch.equal(bits(a), bits(b))]


def fused_views(spec: OpSpec, case: Case, impl: Implementation, device) -> list[Finding]:
    """Layout arguments as views of one fused buffer, with a bystander block (V) beside them."""
    prepared = prepare(spec, case, device, maths=impl.maths(spec.name), saved=impl.saves_in_input_dtype(spec.name))
    first = prepared.args[spec.layout_args[0]]
    shapes = {n: tuple(prepared.args[n].shape) for n in spec.layout_args} | {"bystander": tuple(first.shape)}
    home = GuardedTensor(spec.fusion.shape(shapes), first.dtype, device, label="fused buffer")
    args, leaves = place(spec, case, {n: v for n, v in prepared.args.items() if n not in spec.layout_args},
                         device, [home])
    # Fill the buffer, then route it through one differentiable copy from a leaf of its own shape:
    # the views taken afterwards belong to a non-leaf (in-place is legal, as for a projection's
    # output) and their gradients arrive on that leaf, at the views' positions.
    with torch.no_grad():
        for name, view in spec.fusion.views(home.tensor, shapes).items():
            value = prepared.args.get(name)
            view.copy_(value if value is not None else fill(shapes[name], first.dtype, "normal", generator(case, "V"), device))
    fused_leaf = home.tensor.detach().clone().requires_grad_()
    with torch.enable_grad():
        views = spec.fusion.views(home.tensor.copy_(fused_leaf), shapes)
    args |= {n: views[n] for n in spec.layout_args}
    untouched = Snapshot({"bystander": views["bystander"]} |
                         {n: views[n] for n in spec.layout_args if n not in impl.clobbers(spec.name)})
    with torch.enable_grad(), rehomed_allocations() as allocations:
        outs = dict(zip(spec.outputs, spec.call(impl.op(spec.name), args)))
        got = {n: out.detach().clone() for n, out in outs.items()}
        if spec.differentiable:
            torch.autograd.backward([outs[n] for n in spec.outputs], [prepared.upstream[n] for n in spec.outputs])
    if spec.differentiable:
        fused_grads = spec.fusion.views(fused_leaf.grad, shapes)
        got |= {"d" + n: fused_grads[n] if n in spec.layout_args else leaves[n].grad for n in spec.differentiable}
    findings = changed_findings(untouched, "views", "forward/backward", "changed")
    return findings + _verdict_findings("views", spec, got, prepared, spec.compared()) + \
        guard_findings("views", [home] + allocations)


def version_counter(spec: OpSpec, case: Case, impl: Implementation, device) -> list[Finding]:
    """Each argument the op may overwrite, saved first by another op (``(T * c).sum()`` saves T for
    c's gradient): after the op, that backward must raise autograd's version-counter error."""
    findings = []
    prepared = prepare(spec, case, device)
    for name in sorted(impl.clobbers(spec.name)):
        if not isinstance(prepared.args.get(name), torch.Tensor):
            continue
        args, _ = place(spec, case, prepared.args, device, [])
        with torch.enable_grad():
            source = prepared.args[name].detach().clone().requires_grad_()
            T = torch.empty_like(source).copy_(source)  # a non-leaf: the op may rotate/overwrite it
            args[name] = T
            original = T.detach().clone()
            c = torch.ones_like(source).requires_grad_()
            saved = (T * c).sum()
            spec.call(impl.op(spec.name), args)
            try:
                saved.backward()
            except RuntimeError as exc:
                if "modified by an inplace operation" in str(exc):
                    continue
                raise
        if not torch.equal(bits(c.grad), bits(original)):
            findings.append(Finding("version-counter", name, "forward",
                                    "overwritten without telling autograd: a gradient that needed the old values "
                                    "came back silently wrong instead of raising"))
    return findings


def deterministic(spec: OpSpec, case: Case, impl: Implementation, device) -> list[Finding]:
    """Two runs from identical, freshly placed inputs: every output and gradient bit for bit equal."""
    prepared = prepare(spec, case, device)

    def once() -> dict[str, torch.Tensor]:
        args, leaves = place(spec, case, prepared.args, device, [])
        with torch.enable_grad():
            outs = dict(zip(spec.outputs, spec.call(impl.op(spec.name), args)))
            got = {n: bits(out).clone() for n, out in outs.items()}
            if spec.differentiable:
                torch.autograd.backward([outs[n] for n in spec.outputs],
                                        [prepared.upstream[n].clone() for n in spec.outputs])
        return got | {"d" + n: bits(leaf.grad).clone() for n, leaf in leaves.items() if leaf.grad is not None}

    first, second = once(), once()
    findings = []
    for name in first:
        if name not in second or not torch.equal(first[name], second[name]):
            differ = int((first[name] != second[name]).sum()) if name in second else first[name].numel()
            findings.append(Finding("deterministic", name, "forward" if name in spec.outputs else "backward",
                                    f"a second run on identical inputs gave other bits ({differ} element(s))"))
    return findings


CHECKS: dict[str, tuple[Callable, Callable[[OpSpec], bool]]] = {
    # name: (check, applies to the spec?)
    "sum-loss": (sum_loss, lambda spec: bool(spec.differentiable)),
    "shared-input": (shared_input, lambda spec: bool(spec.differentiable)),
    "retain-graph": (retain_graph, lambda spec: bool(spec.differentiable)),
    "views": (fused_views, lambda spec: spec.fusion is not None and bool(spec.layout_args)),
    "version-counter": (version_counter, lambda spec: True),
    "deterministic": (deterministic, lambda spec: True),
    "compile": (compile_check.check, lambda spec: True),
}


def applicable(spec: OpSpec) -> list[str]:
    return [name for name, (_, applies) in CHECKS.items() if applies(spec)]


def run_check(name: str, spec: OpSpec, case: Case, impl: Implementation, device) -> list[Finding]:
    """One check; an exception inside it is itself a finding (with the traceback's last lines)."""
    check, _ = CHECKS[name]
    COVERAGE[("check", spec.name, case.variant, case.dtype, name)] += 1
    for hook in INFLIGHT_HOOKS:
        hook(case, impl.name, name)
    try:
        with time_limit(f"check {name} on {case.summary()}"):
            return check(spec, case, impl, device)
    except Exception:  # noqa: BLE001 - report, do not lose the other checks
        return [Finding(name, spec.name, "-", "the check raised:\n" + traceback.format_exc(limit=-4))]
    finally:
        for hook in INFLIGHT_HOOKS:
            hook(None, None)


def run_all(spec: OpSpec, case: Case, impl: Implementation, device) -> dict[str, list[Finding]]:
    return {name: run_check(name, spec, case, impl, device) for name in applicable(spec)}

