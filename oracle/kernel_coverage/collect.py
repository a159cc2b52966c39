"""Recording what of each Triton kernel a run exercised: the lines of its Python body that ran (under
the CPU interpreter, which runs that body), the constexpr specialisations it launched with (CPU and
GPU), and the autotune configs the harness judged.

Note [Probes, not a tracer]
    Under the interpreter a kernel's body is Python: Triton parses its source, rewrites the tree and
    compiles it again, keeping the file's line numbers. ``install`` adds one step to that rewrite: a
    probe call before every statement, ``_oracle_kernel_line_(kernel, line)``, bound in the kernel's
    globals (where the interpreter binds its own names). A line tracer (``sys.settrace``) would see
    the same lines, but it is called on every Python call inside a launch, the interpreter's own
    machinery included: it made the CPU suite's RMSNorm cases 3.5 times slower, where the probes cost
    a call per kernel statement run. A kernel rewritten before ``install`` (none under the harness,
    which installs when it loads an implementation) runs unprobed. Triton's own @jit helpers
    (``tl.sum``) are not probed. On a GPU the kernel runs compiled: there are no lines to see, and
    only the specialisations and configs are recorded, from Triton's ``JITFunction.run`` (this
    repository's direct launcher passes through it on the first launch of each signature, so every
    distinct specialisation is seen, though launches are not counted).

A record belongs to a scope: the op whose case is running (``case_hook``), or ``OUTSIDE`` for
launches no case made (a float64 check, a test's own call). ``capture()`` additionally collects the
(kernel, line) pairs of one stretch of work: mutation testing's per-case coverage.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import os
import sys
from collections import Counter
from dataclasses import dataclass, field

from oracle.kernel_coverage.source import KernelSource, constexpr_names, kernel_source, python_function

OUTSIDE = "(outside cases)"
ORIGINAL = "_oracle_original"  # as oracle/interpreter/patches.py marks a replaced function


@dataclass
class KernelRecord:
    source: KernelSource
    hits: set[int] = field(default_factory=set)
    specialisations: Counter = field(default_factory=Counter)
    configs: Counter = field(default_factory=Counter)
    # An autotuned kernel's configs: several autotuners may wrap one definition (a factory making a
    # kernel per config list), and the record is the definition's, so it counts their union.
    configs_listed: set[str] = field(default_factory=set)
    launched: bool = False  # False: a @triton.jit helper only ever called from kernels
    traced: bool = False  # its statements were probed (the interpreter ran it; Note [Probes, not a tracer])

    def to_json(self) -> dict:
        return {"name": self.source.name, "file": self.source.file, "module": self.source.module,
                "first_line": self.source.first_line,
                "statements": sorted(self.source.statements), "hits": sorted(self.hits & self.source.statements),
                "specialisations": dict(self.specialisations), "configs": dict(self.configs),
                "configs_listed": sorted(self.configs_listed), "configs_total": len(self.configs_listed) or None,
                "launched": self.launched, "traced": self.traced}


class Recorder:
    def __init__(self) -> None:
        self.records: dict[str, dict[str, KernelRecord]] = {}
        self.capturing: set | None = None
        self.sources: list[KernelSource] = []  # a probed kernel's number -> its source
        # A probed kernel's number -> the hits of its record in the current scope: a probe runs once
        # per statement per program, so it must cost a dict lookup, not a record's key made again.
        self._scoped_hits: dict[int, set[int]] = {}
        self.scope = OUTSIDE

    @property
    def scope(self) -> str:
        return self._scope

    @scope.setter
    def scope(self, scope: str) -> None:
        self._scope = scope
        self._scoped_hits.clear()

    def record(self, source: KernelSource) -> KernelRecord:
        scoped = self.records.setdefault(self.scope, {})
        record = scoped.get(source.key)
        if record is None:
            record = scoped[source.key] = KernelRecord(source)
        return record

    def launched(self, fn, args: tuple, kwargs: dict) -> None:
        source = _users_source(fn)
        if source is None:
            return
        record = self.record(source)
        record.launched = True
        record.specialisations[specialisation(fn, args, kwargs)] += 1

    def config_ran(self, tuner, config, total: int) -> None:
        source = _users_source(tuner) if enabled() else None
        if source is None:
            return
        record = self.record(source)
        record.configs[str(config)] += 1
        # before the run pins its one config, ``tuner.configs`` lists them all (oracle/cases/autotune.py)
        listed = [str(c) for c in getattr(tuner, "configs", ())]
        record.configs_listed.update(listed if len(listed) == total else [str(config)])

    def to_json(self) -> dict:
        return {scope: {key: r.to_json() for key, r in kernels.items()} for scope, kernels in self.records.items()}

    def reset(self) -> None:
        self.records.clear()
        self._scoped_hits.clear()

    def hit(self, kernel: int, line: int) -> None:
        """A kernel statement about to run (Note [Probes, not a tracer])."""
        hits = self._scoped_hits.get(kernel)
        if hits is None:
            record = self.record(self.sources[kernel])
            record.traced = True
            hits = self._scoped_hits[kernel] = record.hits
        hits.add(line)
        if self.capturing is not None:
            self.capturing.add((self.sources[kernel].key, line))


RECORDER = Recorder()


def specialisation(fn, args: tuple, kwargs: dict) -> str:
    """'NAME=value, ...' for a launch's constexpr arguments (defaults included), in signature order."""
    signature, names = _constexprs(python_function(fn))
    if not names:
        return "(no constexpr)"
    try:
        bound = signature.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
    except TypeError:
        return "(unbound)"
    bound.apply_defaults()
    return ", ".join(f"{name}={_shown(bound.arguments.get(name))}" for name in names)


@functools.lru_cache(maxsize=1024)
def _constexprs(fn) -> tuple[inspect.Signature, list[str]]:
    """A kernel's signature and constexpr names, read once: on a GPU a library's kernel passes
    through JITFunction.run at every launch, and reading them took half a millisecond."""
    return inspect.signature(fn), constexpr_names(fn)


def _shown(value) -> str:
    value = getattr(value, "value", value)  # a tl.constexpr wrapper
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


@contextlib.contextmanager
def capture():
    """Collect the (kernel key, line) pairs traced inside the block into the yielded set."""
    previous, RECORDER.capturing = RECORDER.capturing, set()
    try:
        yield RECORDER.capturing
    finally:
        if previous is not None:
            previous.update(RECORDER.capturing)
        RECORDER.capturing = previous


def case_hook(case, impl_name=None, check=None) -> None:
    """An ``oracle.engine.INFLIGHT_HOOKS`` hook: launches from a case's start to its end belong to its op."""
    install()
    RECORDER.scope = OUTSIDE if case is None else case.op


# --- hooks into the loaded Triton -----------------------------------------------------------------

PROBE = "_oracle_kernel_line_"


class _Probes(ast.NodeTransformer):
    """Puts ``PROBE(kernel, line)`` before every statement of a function's body, at any depth."""

    def __init__(self, kernel: int) -> None:
        self.kernel = kernel

    def generic_visit(self, node):
        super().generic_visit(node)
        if isinstance(node, ast.Module):
            return node
        for name in ("body", "orelse", "finalbody"):
            statements = getattr(node, name, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                setattr(node, name, [part for s in statements for part in self._probed(s)])
        return node

    def _probed(self, statement: ast.stmt) -> list[ast.stmt]:
        call = ast.Expr(ast.Call(ast.Name(PROBE, ast.Load()), [ast.Constant(self.kernel), ast.Constant(statement.lineno)], []))
        return [ast.copy_location(call, statement), statement]


def _probed_transform(original):
    def transform(self, src):
        tree = original(self, src)
        source = _users_source(self.fn)
        if source is None:
            return tree
        self.fn.__globals__[PROBE] = RECORDER.hit
        RECORDER.sources.append(source)
        return ast.fix_missing_locations(_Probes(len(RECORDER.sources) - 1).visit(tree))

    setattr(transform, ORIGINAL, original)
    return transform


HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the oracle package


@functools.lru_cache(maxsize=None)
def _not_the_users(file: str) -> bool:
    """A kernel of Triton's own (``tl.sum``), or of the harness's (its interpreter probes): never the
    code under test, so neither probed nor recorded."""
    import triton

    here = os.path.abspath(file)
    return any(here.startswith(folder + os.sep) for folder in (os.path.dirname(os.path.abspath(triton.__file__)), HARNESS))


def _users_source(kernel) -> KernelSource | None:
    """The kernel's source, or None without one or for a kernel that is not the user's."""
    source = kernel_source(kernel)
    return None if source is None or _not_the_users(source.file) else source


def _recorded_run(original):
    """A kernel's ``run`` (the interpreter's or Triton's compiled one) that records the launch first."""
    def run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            RECORDER.launched(self.fn, args, kwargs)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    setattr(run, ORIGINAL, original)
    return run


SWITCH = "ORACLE_KERNEL_COVERAGE"  # 0 (or off, false, no): record nothing, hook nothing


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def install() -> bool:
    """Hook the loaded Triton (once); False where Triton is not loaded yet (nothing has launched) or
    coverage is switched off (ORACLE_KERNEL_COVERAGE=0: measuring what the probes cost)."""
    if "triton" not in sys.modules or not enabled():
        return False
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    hooks = [(JITFunction, "run", _recorded_run)]
    if hasattr(interpreter, "FunctionRewriter"):  # a Triton whose interpreter rewrites a kernel's source (3.4+)
        hooks += [(interpreter.InterpretedFunction, "run", _recorded_run),
                  (interpreter.FunctionRewriter, "_transform_ast", _probed_transform)]
    for owner, name, wrap in hooks:
        current = inspect.getattr_static(owner, name, None)
        if current is None:
            continue
        if not getattr(current, "_kernel_coverage", False):
            wrapped = wrap(current)
            wrapped._kernel_coverage = True
            setattr(owner, name, wrapped)
    return True
