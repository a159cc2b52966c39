"""Where a declared reference goes non-finite: the statement of it to change, and why.

Note [Naming the statement that overflows]
    The verdict knows that HF's reference is non-finite where the float64 truth is a number of the
    dtype (oracle/verdict, Note [A reference that overflows]); what a user needs is the line to
    change. ``diagnose`` runs the reference forward once more on the case's arguments (copies, no
    autograd) under a TorchDispatchMode that sees every aten op, and looks for two steps:

    - the culprit: the first op whose floating output is non-finite where its floating inputs are
      finite (element by element where the inputs broadcast to the output, else the inputs whole;
      a non-finite scalar argument, a mask's -inf, is an input too). The same op evaluated in
      float64 on its inputs' float64 values tells why: finite there, the op overflows by itself
      (x * x past 65504); non-finite there too (rsqrt(0), x / 0), its inputs were already lost.
    - the underflow that lost them: a 16-bit output element that is 0 or subnormal where that op in
      float64 gives a nonzero number below the dtype's smallest normal, off by more than the dtype's
      epsilon. Underflow alone is often harmless (a tiny square summed with large ones), so it is
      named only where it caused the culprit: every tensor carries the first underflow it was
      computed from, and the culprit of the second kind names the one its inputs carry. A forward
      with no culprit (only a gradient is non-finite: autograd's derivative of that 0) names its
      first underflow as the likely cause.

    A step's statement is found on the Python stack when the op runs: the innermost frame in the
    reference's own source file (a helper in that file included), since that is what the user
    edits. Where the reference has no source file, or it is the harness's (a module wrapped by
    ``from_module``), the innermost frame outside torch, the standard library and ``oracle/``.
    Ops that return uninitialised memory (``empty_like``) are not judged: they may hold anything.
"""

from __future__ import annotations

import inspect
import math
import os
import sysconfig
import traceback
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

SIXTEEN_BIT = (torch.float16, torch.bfloat16)
_UNINITIALISED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}


def _folder(path: str) -> str:
    return os.path.join(os.path.normcase(os.path.realpath(path)), "")


_PATHS = sysconfig.get_paths()
_ORACLE = _folder(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NOT_USERS = (_ORACLE, _folder(os.path.dirname(torch.__file__)), _folder(_PATHS["stdlib"]))
_INSTALLED = (_folder(_PATHS["purelib"]), _folder(_PATHS["platlib"]))  # may lie inside the standard library's


@dataclass(frozen=True)
class Statement:
    """A line of the user's source: where, and its text."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} `{self.text}`"


@dataclass(frozen=True)
class Step:
    """One aten op the watch singled out, at its first singled-out element: what it gave there and
    what the same op gives in float64 on the same inputs (None where that could not be evaluated)."""

    op: str
    dtype: torch.dtype
    statement: Statement | None
    found: float
    exact: float | None
    inputs: tuple[float, float]  # smallest and largest |finite input|, scalars included

    def where(self, text: bool = True) -> str:
        """At file:line and, with ``text``, the statement's source."""
        if self.statement is None:
            return "(no line of the reference's on the stack)"
        return f"at {self.statement}" if text else f"at {self.statement.file}:{self.statement.line}"

    def gives(self) -> str:
        return "0" if self.found == 0 else f"{self.found:g}"  # -0 or 0: the sign says nothing here


# --- which frame is the user's -------------------------------------------------------------------


def _real(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _shown(path: str) -> str:
    """A path as a user reads it: relative to the working directory where it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def source_file(reference) -> str | None:
    """The file ``reference`` is written in, or None where it has none."""
    try:
        found = inspect.getsourcefile(inspect.unwrap(reference))
    except (TypeError, OSError):
        return None
    return _real(found) if found else None


def _users(path: str) -> bool:
    """Whether a file is outside torch, the standard library and the harness."""
    real = _real(path)
    return not path.startswith("<") and not real.startswith(_NOT_USERS[:2]) and \
        (not real.startswith(_NOT_USERS[2]) or real.startswith(_INSTALLED))


def statement(frames: list, reference_file: str | None) -> Statement | None:
    """Among ``frames`` (the stack inside the reference's call, outermost first), the user's
    statement (Note [Naming the statement that overflows])."""
    inner = frames[::-1]
    ours = reference_file is not None and reference_file.startswith(_ORACLE)
    chosen = None if ours else next((f for f in inner if _real(f.filename) == reference_file), None)
    if chosen is None:
        chosen = next((f for f in inner if _users(f.filename)), None)
    if chosen is None:  # the harness's own reference (a built-in op's)
        chosen = next((f for f in inner if _real(f.filename) == reference_file), None)
    if chosen is None:
        return None
    return Statement(_shown(chosen.filename), chosen.lineno, (chosen.line or "").strip())


# --- one op's inputs and outputs ------------------------------------------------------------------


def _floating(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _in_float64(value):
    if _floating(value):
        return value.detach().to(torch.float64, copy=True)
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return torch.float64  # a cast or an accumulation dtype: evaluated exactly instead
    return value


def _exactly_comparable(func) -> bool:
    """Whether the op in float64 computes what it computes in the input's dtype: not a random draw
    (a second one would also move the reference's generator) nor a reinterpretation of bits."""
    return torch.Tag.nondeterministic_seeded not in func.tags and func is not torch.ops.aten.view.dtype


class _Operands:
    """An op's inputs as they were before it ran (an in-place op overwrites its first): the floating
    tensors, which of their elements are non-finite, the floating scalars, and float64 copies."""

    def __init__(self, func, args, kwargs):
        self.func = func
        leaves, _ = tree_flatten((args, kwargs))
        self.tensors = [t for t in leaves if _floating(t)]
        self.nonfinite = [~torch.isfinite(t) for t in self.tensors]
        self.scalars = [v for v in leaves if isinstance(v, float)]
        self.wide_args, self.wide_kwargs = tree_map(_in_float64, (args, kwargs))
        self._exact: list[torch.Tensor] | None = None
        self._magnitudes: tuple[float, float] | None = None

    def exact(self, position: int, like: torch.Tensor) -> torch.Tensor | None:
        """The op's ``position``-th floating output evaluated in float64, or None where it cannot be
        (evaluated once: an in-place op writes into its float64 copies)."""
        if self._exact is None and not _exactly_comparable(self.func):
            self._exact = []
        if self._exact is None:
            self.magnitudes()  # first: an in-place op's float64 evaluation writes into the copies
            try:
                self._exact = [t for t in tree_flatten(self.func(*self.wide_args, **self.wide_kwargs))[0]
                               if _floating(t)]
            except Exception:  # noqa: BLE001 - an op without a float64 kernel: no exact value to compare
                self._exact = []
        outs = self._exact
        if position >= len(outs) or outs[position].shape != like.shape:
            return None
        return outs[position].to(like.device)

    def magnitudes(self) -> tuple[float, float]:
        """The smallest and largest |finite input| before the op ran (read from the float64 copies)."""
        if self._magnitudes is None:
            values = [abs(s) for s in self.scalars if math.isfinite(s)]
            for t in (t for t in tree_flatten((self.wide_args, self.wide_kwargs))[0] if _floating(t)):
                finite = t.abs()[torch.isfinite(t)]
                if finite.numel():
                    values += [float(finite.min()), float(finite.max())]
            self._magnitudes = (min(values), max(values)) if values else (math.nan, math.nan)
        return self._magnitudes


def _broadcasts_to(shape, out_shape) -> bool:
    try:
        return torch.broadcast_shapes(shape, out_shape) == out_shape
    except RuntimeError:
        return False


def new_nonfinite(out: torch.Tensor, operands: _Operands) -> torch.Tensor | None:
    """Where ``out`` is non-finite and the inputs it came from are finite (None: nowhere)."""
    bad = ~torch.isfinite(out)
    if not bad.any() or not all(math.isfinite(s) for s in operands.scalars):
        return None
    for nonfinite in operands.nonfinite:
        if _broadcasts_to(nonfinite.shape, out.shape):
            bad &= ~nonfinite.to(out.device).broadcast_to(out.shape)
        elif nonfinite.any():  # a reduction or a product over non-finite inputs: not of this op's making
            return None
    return bad if bad.any() else None


def underflowed(out: torch.Tensor, exact: torch.Tensor | None) -> torch.Tensor | None:
    """Where a 16-bit ``out`` is 0 or subnormal and its exact value a lost number below the smallest normal."""
    if out.dtype not in SIXTEEN_BIT or exact is None:
        return None
    info = torch.finfo(out.dtype)
    lost = (out.abs() < info.tiny) & (exact != 0) & (exact.abs() < info.tiny) & \
        ((out.double() - exact).abs() > info.eps * exact.abs())
    return lost if lost.any() else None


def _first(mask: torch.Tensor, prefer: torch.Tensor | None = None) -> int:
    """The first element of ``mask``, or of ``mask & prefer`` where there is one."""
    if prefer is not None and (mask & prefer).any():
        mask = mask & prefer
    return int(mask.flatten().nonzero()[0])


# --- the watch ------------------------------------------------------------------------------------


class _Watch(TorchDispatchMode):
    """Runs every op as it is, and notes the culprit, the underflow it came from (if any), and which
    underflow each tensor is computed from (Note [Naming the statement that overflows])."""

    def __init__(self, reference_file: str | None, depth: int):
        super().__init__()
        self.reference_file, self.depth = reference_file, depth
        self.culprit: Step | None = None
        self.cause: Step | None = None
        self.underflows: list[Step] = []
        self._origins: dict[int, tuple[weakref.ref, int]] = {}  # id(tensor) -> (the tensor, its underflow)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.culprit is not None or func.overloadpacket.__name__ in _UNINITIALISED:
            return func(*args, **kwargs)
        operands = _Operands(func, args, kwargs)
        origin = self._origin(operands.tensors)
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if _floating(t)]
        for position, o in enumerate(outs):
            bad = new_nonfinite(o, operands)
            if bad is not None:
                self.culprit = self._step(operands, position, o, bad)
                if origin is not None and (self.culprit.exact is None or not math.isfinite(self.culprit.exact)):
                    self.cause = self.underflows[origin]  # its inputs were lost, by that underflow
                return out
        if origin is None:
            origin = self._underflow(operands, outs)
        if origin is not None:
            self._origins.update({id(o): (weakref.ref(o), origin) for o in outs})
        return out

    def _origin(self, tensors: list[torch.Tensor]) -> int | None:
        """The first underflow any of ``tensors`` is computed from."""
        found = [entry[1] for t in tensors if (entry := self._origins.get(id(t))) is not None and entry[0]() is t]
        return min(found, default=None)

    def _underflow(self, operands: _Operands, outs: list[torch.Tensor]) -> int | None:
        for position, o in enumerate(outs):
            if o.dtype not in SIXTEEN_BIT or not (o.abs() < torch.finfo(o.dtype).tiny).any():
                continue  # nothing 0 or subnormal: no float64 evaluation needed
            lost = underflowed(o, operands.exact(position, o))
            if lost is not None:
                self.underflows.append(self._step(operands, position, o, lost, prefer=o == 0))
                return len(self.underflows) - 1
        return None

    def _step(self, operands: _Operands, position: int, out: torch.Tensor, mask: torch.Tensor,
              prefer: torch.Tensor | None = None) -> Step:
        index = _first(mask, prefer)
        exact = operands.exact(position, out)
        where = statement(traceback.extract_stack()[self.depth:], self.reference_file)
        return Step(str(operands.func.overloadpacket), out.dtype, where, float(out.flatten()[index]),
                    None if exact is None else float(exact.flatten()[index]), operands.magnitudes())


# --- the diagnosis --------------------------------------------------------------------------------


def diagnose(spec, args: dict) -> str:
    """One sentence naming the step of ``spec``'s reference that goes non-finite on ``args`` (the
    arguments HF's evaluation was given; they are copied, not changed) and what to change there.
    Never raises: a failure of its own becomes a line saying so."""
    try:
        return _diagnosis(spec, args)
    except Exception as exc:  # noqa: BLE001 - the diagnosis only explains; it must not fail a run
        return (f"the step where HF's reference goes non-finite could not be located (the diagnosis raised "
                f"{type(exc).__name__}); compute it in a wider dtype")


def _diagnosis(spec, args: dict) -> str:
    culprit, cause, finite = find_steps(spec, args)
    return described(culprit, cause, _input_name(args), finite)


def find_steps(spec, args: dict) -> tuple[Step | None, Step | None, bool]:
    """The culprit, the underflow that caused it (None where it overflows by itself), and whether the
    forward's outputs are finite: ``spec.reference`` run forward on copies of ``args``. A forward
    that is finite has no culprit; its first underflow, if any, stands as the cause (autograd's
    derivatives of a 0 that should be a number are where its gradients go non-finite)."""
    copies = {name: v.detach().clone() if isinstance(v, torch.Tensor) else v for name, v in args.items()}
    watch = _Watch(source_file(spec.reference), len(traceback.extract_stack()))
    with torch.no_grad(), watch:
        outputs = spec.call(spec.reference, copies)
    finite = all(bool(torch.isfinite(t).all()) for t in tree_flatten(outputs)[0] if _floating(t))
    if watch.culprit is None and finite and watch.underflows:  # the gradients' likely cause
        return None, watch.underflows[0], finite
    return watch.culprit, watch.cause, finite


def _input_name(args: dict) -> str:
    """The argument a user upcasts: the first 16-bit one."""
    return next((name for name, v in args.items() if isinstance(v, torch.Tensor) and v.dtype in SIXTEEN_BIT), "x")


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _number(value: float) -> str:
    """Three significant digits, without an exponent where the value reads well without one."""
    return f"{float(f'{value:.3g}'):g}" if 1e-3 <= abs(value) < 1e6 else f"{value:.3g}"


def _underflow(step: Step) -> str:
    dtype = _dtype(step.dtype)
    return (f"underflows in {dtype} {step.where()}: {step.op} gives {step.gives()} where the exact value is "
            f"{step.exact:.2g} ({dtype}'s smallest normal is {torch.finfo(step.dtype).tiny:.2g})")


def described(culprit: Step | None, cause: Step | None, name: str, finite: bool = False) -> str:
    """The diagnosis as a user acts on it; ``finite``: whether the forward's outputs were."""
    advice = (f"compute this step in float32 (`{name}.float()` before it, `.to({name}.dtype)` where the op's "
              "result is rounded), as Hugging Face's norms do")
    if culprit is None and finite:
        forward = ("HF's reference is finite in its forward on this case's inputs, so its non-finite values are "
                   "its gradients', which autograd computes in its dtypes")
        if cause is None:
            return f"{forward}: {advice.replace('this step', 'it')}"
        return f"{forward}; a likely cause, its forward first {_underflow(cause)}: {advice}"
    if culprit is None:
        return ("HF's reference gives non-finite outputs, but no step of it turns finite inputs into non-finite "
                f"values (they are in its inputs already): {advice.replace('this step', 'it')}")
    dtype, low, high = _dtype(culprit.dtype), *culprit.inputs
    if cause is not None:
        return (f"HF's reference first {_underflow(cause)}; {culprit.op} {culprit.where(text=False)} then gives "
                f"{culprit.gives()}; {advice}")
    if culprit.exact is None or math.isfinite(culprit.exact):
        return (f"HF's reference first overflows in {dtype} {culprit.where()}: {culprit.op} gives {culprit.gives()} "
                f"from finite inputs (largest |input| {_number(high)}, {dtype}'s largest finite value "
                f"{torch.finfo(culprit.dtype).max:.6g}); {advice}")
    return (f"HF's reference first goes non-finite in {dtype} {culprit.where()}: {culprit.op} gives "
            f"{culprit.gives()} from finite inputs (|input| from {_number(low)} to {_number(high)}), as it does "
            f"in float64: an earlier step has lost its inputs' values; {advice}")
