"""The ``compile`` check (docs/design.md §4): an implementation inside ``torch.compile(fullgraph=True)``
gives the bits it gives in eager mode, in forward and in every gradient.

For one case and one implementation's op:

1. If the op is a ``torch.library`` custom op (the callable is one, or a wrapper naming the op it
   calls in its ``custom_op`` attribute): the arguments its schema marks mutated (``Tensor(a!)``)
   must be exactly the implementation's ``CLOBBERS[op]``, and ``torch.library.opcheck`` must pass
   on the case's arguments. An op that overwrites an input its schema does not declare is silently
   wrong under torch.compile (functionalization takes it for a pure function, and a compiled graph
   may read the input after the op as if it were intact): a failure.
2. The op is called on identical, freshly placed inputs in eager mode and inside a fresh
   ``torch.compile(fullgraph=True)``; every output and every gradient must be the same bits.
3. A graph break (or any failure to compile) is reported with its reason: a note by default, a
   failure when the implementation declares that the op compiles (``COMPILES = True``, or a set of
   op names). See Note [Notes].

Note [The backend]
    The check compiles with ``backend="aot_eager"``: Dynamo's tracing (graph breaks, Python state
    baked into the graph), fake tensors (an op's fake implementation), functionalization of its
    mutations and AOTAutograd's tracing of its autograd formula, that is everything torch.compile
    does *to an implementation*; then the captured graphs run op for op. Inductor's code generation
    would add its own numerics to any torch code in the graph: it keeps fused intermediates in fp32
    instead of rounding them to bf16, and has its own exp, erf and tanh, so torch.compile of HF's
    own maths differs from eager in the last bits (measured on CPU: every GeGLU case, fp32 too).
    Those bits are Inductor's, not the implementation's, and ``--impl compile`` already judges them
    with the verdict. A custom op is opaque to Inductor: it runs the same launch either way.

Note [Notes]
    A note is a finding that does not fail: the check returns only failures, and hands each note to
    ``note()``, which keeps it in ``NOTES`` (this process's notes). It is no warning: an op that does
    not declare COMPILES breaking the graph is nothing its author asked to be told about case by
    case, and a warning per case buried every run's output under the same lines. The pytest plugin
    counts the notes of every worker and lists each one once in the session's summary; the report
    does not show them. Nothing else in the harness changes.

Note [Once per op, variant and dtype]
    Compiling is slow on a CPU, and the generic suite calls every check on several drawn cases per
    op besides its pinned ones. So the check runs once per implementation, op, variant and dtype in
    a process (on the first case it is given, in the suite one of the short pinned cases), and later
    cases of the same key get that run's findings back, each saying which case it was found on.
    Each run compiles a fresh function (its own code object): Dynamo keeps compiled graphs per code
    object, and with fullgraph=True a ninth shape of one code object fails on the recompile limit.
"""

from __future__ import annotations

import types
from dataclasses import replace

import torch
from torch._library.custom_ops import CustomOpDef

from oracle.cases import Case
from oracle.engine import Finding, place
from oracle.declare.implementations import Implementation
from oracle.checks.memory import bits
from oracle.declare.spec import OpSpec, upstream_gradient

CHECK = "compile"
BACKEND = "aot_eager"  # Note [The backend]

NOTES: list[Finding] = []
_DONE: dict[tuple, tuple[str, list[Finding]]] = {}  # Note [Once per op, variant and dtype]


def note(finding: Finding) -> None:
    """Keep a finding that does not fail (Note [Notes])."""
    NOTES.append(finding)


def declares_compiles(impl: Implementation, op: str) -> bool:
    """The implementation's ``COMPILES``: True for every op, or a collection of op names."""
    declared = getattr(impl.target, "COMPILES", ())
    return declared is True or (not isinstance(declared, bool) and op in set(declared))


def custom_op_of(fn) -> torch._ops.OpOverload | None:
    """The torch.library op behind a callable: the callable itself (a ``custom_op`` definition, an op
    or its overload packet), or the op a wrapper names in ``custom_op``; None for anything else."""
    target = getattr(fn, "custom_op", fn)
    if isinstance(target, CustomOpDef):
        return target._opoverload
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target.default
    if isinstance(target, torch._ops.OpOverload):
        return target
    return None


def mutated_arguments(op: torch._ops.OpOverload) -> set[str]:
    return {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}


def check(spec: OpSpec, case: Case, impl: Implementation, device) -> list[Finding]:
    """The failures of the check on this case (notes go to ``note``): Note [Once per op, variant and dtype]."""
    key = (impl.name, spec.name, case.variant, case.dtype)
    if key in _DONE:
        label, findings = _DONE[key]
        return [replace(f, message=f"{f.message} (checked once per op, variant and dtype: found on {label})")
                for f in findings]
    findings = run(spec, case, impl, device)
    _DONE[key] = (case.label, findings)
    return findings


def run(spec: OpSpec, case: Case, impl: Implementation, device) -> list[Finding]:
    """The check on this one case, whatever ran before (``check`` is what the harness calls)."""
    fn = impl.op(spec.name)
    if _already_compiled(fn):
        note(Finding(CHECK, spec.name, "compile", "the implementation is itself a torch.compile'd function: "
                     "compiled again it would be inlined under another backend, so there is nothing to compare"))
        return []
    findings = []
    op = custom_op_of(fn)
    if op is not None:
        findings += schema_findings(spec, impl, op) + opcheck_findings(spec, case, op, device)
    eager = _run(spec, case, lambda args: spec.call(fn, args), device)
    try:
        compiled = _run(spec, case, _compiled(spec, fn), device)
    except Exception as exc:  # noqa: BLE001 - a graph break or a failed compile: the reason is the finding
        finding = Finding(CHECK, spec.name, "compile", _why_it_did_not_compile(exc))
        if declares_compiles(impl, spec.name):
            return findings + [replace(finding, message=finding.message + " (the implementation declares COMPILES)")]
        note(finding)
        return findings
    return findings + _differences(spec, eager, compiled)


def _already_compiled(fn) -> bool:
    """A torch.compile'd function (``--impl compile``); torch.compiler.disable marks its functions alike."""
    return hasattr(fn, "_torchdynamo_orig_callable") and not getattr(fn, "_torchdynamo_disable", False)


def schema_findings(spec: OpSpec, impl: Implementation, op: torch._ops.OpOverload) -> list[Finding]:
    """The op's mutated arguments against CLOBBERS, both ways."""
    names = {a.name for a in op._schema.arguments}
    written, declared = mutated_arguments(op), impl.clobbers(spec.name)
    out = []
    for name in sorted(declared - names):
        out.append(Finding(CHECK, name, "schema", f"CLOBBERS declares {name} overwritten, but {op._schema.name} has no "
                           f"argument named {name}: name the op's arguments as the contract does"))
    for name in sorted((declared & names) - written):
        out.append(Finding(CHECK, name, "schema", f"CLOBBERS declares {name} overwritten, but the schema of "
                           f"{op._schema.name} does not mark it mutated (Tensor(a!)): under torch.compile the write "
                           "is invisible, and a compiled graph may read the old value after the op"))
    for name in sorted(written - declared):
        out.append(Finding(CHECK, name, "schema", f"the schema of {op._schema.name} marks {name} mutated, but "
                           f"CLOBBERS does not declare it: the contract says {name} stays intact"))
    return out


def opcheck_findings(spec: OpSpec, case: Case, op: torch._ops.OpOverload, device) -> list[Finding]:
    """torch.library.opcheck on the case's arguments, bound to the op's schema by name; inputs the
    contract differentiates require grad (so the autograd registration is tested), unless the op
    mutates them (a mutating op has no autograd formula). opcheck compares results with
    torch.testing.assert_close, for which NaN differs from NaN: a case with non-finite values is
    opchecked on its normal-valued twin (the bit comparison of step 2 takes the case as it is)."""
    if case.values == "nonfinite":
        case = replace(case, values="normal")
    args = spec.make_args(case, device)
    placed, _ = place(spec, case, args, device, [])
    written = mutated_arguments(op)
    bound = []
    for argument in op._schema.arguments:
        if argument.name not in placed:
            if argument.has_default_value():
                continue
            return [Finding(CHECK, argument.name, "schema", f"{op._schema.name} takes {argument.name}, which the "
                            f"contract's {spec.name} does not have: opcheck cannot be given the case's arguments")]
        value = placed[argument.name]
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if argument.name in spec.differentiable and argument.name not in written:
                value.requires_grad_()
        bound.append(value)
    results = torch.library.opcheck(op, tuple(bound), raise_exception=False)
    return [Finding(CHECK, op._schema.name, "opcheck", f"torch.library.opcheck {test}: {_first_lines(str(result))}")
            for test, result in results.items() if result != "SUCCESS"]


def _compiled(spec: OpSpec, fn):
    """``spec.call(fn, args)`` compiled whole, in a function of its own (Note [Once per op, variant
    and dtype]): static shapes, no graph break allowed."""
    def call(args):
        return spec.call(fn, args)

    fresh = types.FunctionType(call.__code__.replace(), call.__globals__, f"compiled_{spec.name}", None,
                               call.__closure__)
    return torch.compile(fresh, fullgraph=True, backend=BACKEND, dynamic=False)


def _run(spec: OpSpec, case: Case, call, device) -> dict[str, torch.Tensor]:
    """Outputs and gradients of ``call(args) -> outputs`` on freshly placed inputs in the case's
    layout; the upstream gradients are the case's own, drawn for the outputs' shapes."""
    placed, leaves = place(spec, case, spec.make_args(case, device), device, [])
    with torch.enable_grad():
        outs = dict(zip(spec.outputs, call(placed)))
        got = {n: out.detach().clone() for n, out in outs.items()}
        wanted = [n for n in spec.outputs if outs[n].requires_grad]
        if leaves and wanted:
            torch.autograd.backward([outs[n] for n in wanted], [upstream_gradient(case, n, got[n]) for n in wanted])
    return got | {"d" + n: leaf.grad for n, leaf in leaves.items()}


def _differences(spec: OpSpec, eager: dict, compiled: dict) -> list[Finding]:
    out = []
    for name, want in eager.items():
        got = compiled.get(name)
        phase = "forward" if name in spec.outputs else "backward"
        if want is None or got is None:
            if (want is None) != (got is None):
                out.append(Finding(CHECK, name, phase, f"compiled, the gradient is {'missing' if got is None else 'there'}"
                                   f" where eager mode {'gives one' if got is None else 'gives none'}"))
            continue
        if (got.shape, got.dtype) != (want.shape, want.dtype):
            out.append(Finding(CHECK, name, phase, f"compiled, {tuple(got.shape)} {got.dtype}; eager, "
                               f"{tuple(want.shape)} {want.dtype}"))
        elif not torch.equal(bits(got), bits(want)):
            differ = int((bits(got) != bits(want)).sum())
            out.append(Finding(CHECK, name, phase, f"compiled, other bits than in eager mode ({differ} of "
                               f"{want.numel()} element(s))"))
    return out


def _why_it_did_not_compile(exc: Exception) -> str:
    """A graph break is what Dynamo refuses to trace: Unsupported code, or a guard on data (a host
    read such as ``int(t.max())``, a UserError with fullgraph=True, a break without it); anything
    else failed to compile (a fake implementation that raises, a backend error)."""
    dynamo = torch._dynamo.exc
    kind = "graph break" if isinstance(exc, (dynamo.Unsupported, dynamo.UserError)) else \
        f"fails under torch.compile ({type(exc).__name__})"
    return f"{kind}: {_first_lines(str(exc))}"


def _first_lines(text: str, lines: int = 6) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][:lines]
    return " / ".join(line.strip() for line in kept)
