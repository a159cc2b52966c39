"""Implementations under test (docs/design.md §2): built-in names and ``package.module:attr`` loading.

An implementation is any object exposing some of the contract's callables (``OPS``: one per spec of
the registry, named as in ``kernels/__init__.py``) and optionally:

- ``CLOBBERS``: {op: argument names the op may overwrite};
- ``LACKING``: {op: why it is not provided}. A run asks for every op (or those named with
  ``--ops``); an op the implementation neither exposes nor declares here is an error, so that a
  misspelt name (``rmsnorm``) or a wrong import can never pass as "skipped". Declared ones are
  skipped and listed at the end of the run;
- ``NO_FLOAT64``: ops that have no float64 path. Only these skip the float64 checks (the forward
  against the float64 truth, gradcheck).
- ``EXACT_MATHS``: True (or a set of ops): the implementation evaluates exp, division and square
  roots as exactly as CUDA's library does, and is judged without the room fast GPU maths has.
- ``SAVED_IN_INPUT_DTYPE``: True (or a set of ops): the op's backward reads what its forward saved
  rounded to the input's 16-bit dtype (a norm that recomputes from its stored output), a rounding
  point the verdict then grants (oracle/noise/saved.py, Note [Saved activations in the input dtype]).
- ``COMPILES``: True (or a set of ops): the ops go whole into a ``torch.compile`` graph, so that a
  graph break fails the compile check (oracle/checks/compile.py) instead of being a note.
- ``EXACT``: {op: the compared tensors (or True: all of them) that equal HF's bits, or a dict of
  tensor -> ``"bits"`` or ``"rounding"``}: the implementation follows HF's cast order there, and
  every case holds it to that, bit for bit or HF's rounding steps given float32 values within K
  ULPs (oracle/checks/exact.py, Note [Two contracts]); an op's own ``exact`` binds every implementation.

``implementation(my_op=fn, CLOBBERS=..., COMPILES=...)`` builds one from keywords (``ATTRIBUTES``
lists the attributes it takes); its op names are checked when the harness loads it, not when it is
built, so that a module of implementations imports before its ops' declarations are loaded.

Built in:
- ``kernels``: this project's Triton kernels (the repository's default, ``oracle_impl`` in its
  pyproject.toml); only from a checkout, since the wheel installs the harness alone.
- ``hf``: the oracle's own HF maths run as an implementation. It must pass everything; if it
  does not, the harness is wrong, not the kernels.
- ``compile``: ``torch.compile`` of the HF maths (the raw kernels have no HF counterpart to
  compile, so they are declared lacking).
- ``liger``: Liger-Kernel's autograd ops behind the contract's signatures, when ``liger-kernel`` is
  installed (``pip install 'kernel-oracle[liger]'``). It declares no CLOBBERS: Liger documents none.
- ``unsloth``, ``unsloth-inplace``: Unsloth's released kernels, called as Unsloth calls them
  (peers/unsloth/adapter.py); on a GPU, with ``unsloth`` and ``unsloth_zoo`` installed.

hf, compile and liger are built from the registry (oracle/ops/): a new op is covered by them
through its spec.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from oracle import kernel_coverage
from oracle import interpreter
from oracle.declare.registry import SPECS
from oracle.cases import autotune
from oracle.checks import exact as exact_check
from oracle.errors import DeclarationError, ImplementationUnavailable

# What other modules use (``implementation``, ``load`` and ``Implementation`` are re-exported by
# ``oracle``, where a user's code imports them); the rest is internal.
__all__ = ["ADAPTERS", "ATTRIBUTES", "BUILTIN", "OPS", "Implementation", "Partial", "builtin_module", "checkout_root",
           "compile_every_case", "implementation", "load", "prepared", "scalar_inductor_on_a_default_cpu"]

# What an implementation may declare beside its ops, and the form of each.
ATTRIBUTES = {
    "CLOBBERS": "a dict of op -> the argument names it may overwrite",
    "LACKING": "a dict of op -> why it is not provided",
    "NO_FLOAT64": "a collection of the ops without a float64 path",
    "EXACT_MATHS": "True, False or a collection of the ops with exact exp, division and square roots",
    "SAVED_IN_INPUT_DTYPE": "True, False or a collection of the ops whose backward reads what the forward saved, "
                            "rounded to the input's dtype",
    "COMPILES": "True, False or a collection of the ops that go whole into a torch.compile graph",
    "EXACT": "a dict of op -> the compared tensors equal to HF's bits (True: all of them), or a dict of "
             "tensor -> 'bits' or 'rounding'",
}


def __getattr__(name: str):
    """``OPS``: the contract's ops, in the registry's order, declared ops included (read live: a
    module of declarations loaded after this one adds to it)."""
    if name == "OPS":
        return tuple(SPECS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def implementation(**given) -> "Partial":
    """An implementation of some ops (``implementation(layer_norm=my_layer_norm)``) that declares
    every other op of the registry lacking. It takes every attribute of ``ATTRIBUTES`` as a keyword
    (``CLOBBERS``, ``LACKING``, ``NO_FLOAT64``, ``EXACT_MATHS``, ``SAVED_IN_INPUT_DTYPE``, ``COMPILES``, ``EXACT``);
    any other upper-case
    keyword, a value of the wrong form, or an op that is not callable raises DeclarationError here.
    The op names (keywords, and those inside the attributes) are checked when the harness loads the
    implementation (``Implementation``), once the declarations are loaded: an unknown one is an error
    there, so that a misspelt name cannot pass as lacking."""
    attributes = {k: given.pop(k) for k in ATTRIBUTES if k in given}
    for name in sorted(given):
        if name.isupper() and name not in SPECS:
            close = difflib.get_close_matches(name, ATTRIBUTES, n=1)
            raise DeclarationError(f"implementation({name}=...): {name} is not an attribute an implementation "
                                   f"declares{f' (did you mean {close[0]}?)' if close else ''}; those are "
                                   f"{', '.join(ATTRIBUTES)}")
        if not callable(given[name]):
            raise DeclarationError(f"implementation({name}=...): an op must be callable, got "
                                   f"{type(given[name]).__name__} {given[name]!r}")
    for name, value in attributes.items():
        problem = _attribute_problem(name, value)
        if problem is not None:
            raise DeclarationError(f"implementation({name}=...): must be {ATTRIBUTES[name]}, got {value!r}{problem}")
    both = sorted(set(given) & set(attributes.get("LACKING", {})))
    if both:
        raise DeclarationError(f"implementation(LACKING=...): {', '.join(both)} is given as an op and declared lacking")
    return Partial(given, attributes)


def _attribute_problem(name: str, value) -> str | None:
    """Why ``value`` is not of ``ATTRIBUTES[name]``'s form ("" for no detail), or None."""
    def names(collection) -> str | None:
        if isinstance(collection, str):
            return f" (a string is not split into names: write {{{collection!r}}})"
        if not isinstance(collection, (set, frozenset, tuple, list)):
            return ""
        stray = [v for v in collection if not isinstance(v, str)]
        return f" ({stray[0]!r} is not a name)" if stray else None

    if name in ("CLOBBERS", "LACKING", "EXACT"):
        if not isinstance(value, dict):
            return ""
        for op, entry in value.items():
            if name == "LACKING":
                problem = None if isinstance(entry, str) else f" (the reason for {op!r} is not a string)"
            elif name == "EXACT":
                problem = exact_check.form_problem(entry, allow_all=True)
                problem = problem if problem is None else f" (EXACT[{op!r}]: {problem})"
            else:
                problem = names(entry)
            if problem is not None:
                return problem or f" ({name}[{op!r}] is not a collection of names)"
        return None
    if name in ("EXACT_MATHS", "SAVED_IN_INPUT_DTYPE", "COMPILES") and isinstance(value, bool):
        return None
    return names(value)


class Partial(SimpleNamespace):
    """What ``implementation()`` returns: the ops given and the attributes declared, with every
    other op of the registry LACKING, read when the harness asks (so an op declared after this
    object was built counts). ``Implementation`` calls ``check()``."""

    def __init__(self, ops: dict | None = None, attributes: dict | None = None):  # no arguments: as pickle rebuilds
        ops, attributes = dict(ops or {}), dict(attributes or {})
        lacking = dict(attributes.pop("LACKING", {}))
        super().__init__(**ops, **attributes)
        self.__dict__["_ops"] = tuple(ops)
        self.__dict__["_lacking"] = lacking
        self.__dict__["_attributes"] = tuple(attributes)

    @property
    def LACKING(self) -> dict[str, str]:  # noqa: N802 - the contract's name
        return {op: self._lacking.get(op, "not provided by this implementation") for op in SPECS
                if op not in self._ops}

    def check(self) -> None:
        """Every op named, as a keyword or inside an attribute, is a registered op."""
        named = [(tuple(self._ops), None), (tuple(self._lacking), "LACKING")]
        named += [(tuple(getattr(self, a)), a) for a in self._attributes if not isinstance(getattr(self, a), bool)]
        for ops, attribute in named:
            unknown = [op for op in ops if op not in SPECS]
            if not unknown:
                continue
            where = f"{attribute}=..." if attribute else ", ".join(f"{op}=..." for op in unknown)
            hints = "; ".join(f"did you mean {close[0]!r}?" for op in unknown
                              if (close := difflib.get_close_matches(op, SPECS, n=1, cutoff=0.75)))
            raise DeclarationError(
                f"implementation({where}): {', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} "
                f"not a registered op{f' ({hints})' if hints else ''}; the registry's ops are {', '.join(SPECS)}. "
                "A declared op is registered once its module is loaded: --op-module or the ini option "
                "oracle_op_modules, or oracle.load_declarations(...) in a script")

    def __repr__(self) -> str:
        given = [*self._ops, *self._attributes, *(("LACKING",) if self._lacking else ())]
        return f"implementation({', '.join(given)})"



@dataclass(frozen=True)
class Implementation:
    """A loaded implementation (``load``): ``impl.rms_norm(X, W, eps)`` calls an op of the registry
    it provides, as ``impl.op("rms_norm")`` returns it; ``dir(impl)`` lists those ops. An op it
    lacks, or a name that is no op, raises AttributeError saying why. A method's name (``select``,
    ``maths``, ...) is the method, never an op: ``op(name)`` reaches every op."""

    name: str  # as given on the command line
    target: object

    def __post_init__(self):
        if isinstance(self.target, Partial):  # built by implementation(): its op names, now
            self.target.check()
        exact = getattr(self.target, "EXACT", None)  # any target's: a module's or a namespace's too
        problem = None if exact is None else _attribute_problem("EXACT", exact)
        if problem is not None:
            raise DeclarationError(f"EXACT: must be {ATTRIBUTES['EXACT']}, got {exact!r}{problem}")

    def __repr__(self) -> str:  # what pytest and hypothesis print of a test's argument: the name, not the target
        return f"Implementation({self.name!r})"

    def __getattr__(self, name: str):
        # Only for names found nowhere else. A private or special name (pickle's and copy's probes
        # of an object still being rebuilt, before ``target`` is set) is no op: look nothing up.
        if name.startswith("_") or "target" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        found = self.op(name) if name in SPECS else None
        if found is None:
            raise AttributeError(self._why_not(name))
        return found

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(op for op in SPECS if self.op(op) is not None)})

    def _why_not(self, name: str) -> str:
        """Why ``impl.<name>`` is no callable: the op is lacking (and the reason declared), or no op
        of the registry has that name (the close ones named)."""
        if name in SPECS:
            reason = self.declared_lacking().get(name, "it neither provides it nor declares it in LACKING")
            return f"{self.name} lacks the op {name!r}: {reason}"
        close = difflib.get_close_matches(name, SPECS, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        unregistered = ("; an op declared in a module the registry has not loaded is registered by "
                        "load_declarations(module)") if getattr(self.target, name, None) is not None else ""
        return (f"{name!r} is not an op of the registry: {hint}{self.name} provides "
                f"{', '.join(op for op in SPECS if self.op(op) is not None) or 'none of them'}{unregistered}")

    def op(self, op: str):
        return getattr(self.target, op, None)

    def clobbers(self, op: str) -> set[str]:
        return set(getattr(self.target, "CLOBBERS", {}).get(op, set()))

    def lacking(self) -> list[str]:
        return [op for op in SPECS if self.op(op) is None]

    def declared_lacking(self) -> dict[str, str]:
        return dict(getattr(self.target, "LACKING", {}))

    def maths(self, op: str) -> str:
        """Which maths the verdict grants the op (Note [Fast maths] in oracle/noise/rounding.py):
        "exact" where the implementation declares EXACT_MATHS (True, or a set of ops), else "fast"."""
        declared = getattr(self.target, "EXACT_MATHS", False)
        if isinstance(declared, bool):
            return "exact" if declared else "fast"
        return "exact" if op in set(declared) else "fast"

    def saves_in_input_dtype(self, op: str) -> bool:
        """Whether the verdict grants the op's backward its saved activations rounded to the input's
        dtype (SAVED_IN_INPUT_DTYPE: True, or a set of ops; oracle/noise/saved.py)."""
        declared = getattr(self.target, "SAVED_IN_INPUT_DTYPE", False)
        return declared if isinstance(declared, bool) else op in set(declared)

    def exact(self, spec) -> dict[str, str]:
        """The compared tensors of an op (its OpSpec) held to a contract, each to "bits" or "rounding"
        (oracle/checks/exact.py, Note [Two contracts]): the op's own ``exact`` and what the
        implementation declares in EXACT (True: every compared tensor, bit for bit); where both name
        a tensor, bits bind."""
        declared = exact_check.promised(getattr(self.target, "EXACT", {}).get(spec.name, ()), spec.compared())
        both = {**declared, **spec.exact}
        return {name: exact_check.stronger(declared.get(name, contract), spec.exact.get(name, contract))
                for name, contract in both.items()}

    def takes_float64(self, op: str) -> bool:
        return op not in set(getattr(self.target, "NO_FLOAT64", ()))

    def select(self, wanted: list[str] | None = None) -> list[str]:
        """The ops a run tests: ``wanted`` (every op when None) less the ops the implementation
        declares it lacks. Raises ValueError, naming near misses, for any other op it lacks."""
        unknown = sorted(set(wanted or ()) - set(SPECS))
        if unknown:
            raise ValueError(f"unknown op(s) {', '.join(unknown)}: the contract's ops are {', '.join(SPECS)}")
        asked = [op for op in SPECS if wanted is None or op in wanted]
        declared = self.declared_lacking()
        if wanted is not None:
            refused = [op for op in asked if op in declared and self.op(op) is None]
            if refused:
                raise ValueError(f"{self.name} declares it lacks {', '.join(refused)} "
                                 f"({'; '.join(declared[op] for op in refused)}), yet --ops asks for it")
        missing = [op for op in asked if self.op(op) is None and op not in declared]
        if missing:
            raise ValueError(f"{self.name} lacks {', '.join(missing)}{self._near_misses(missing)}; test a subset with "
                             "--ops, or declare LACKING = {op: reason} in the implementation")
        chosen = [op for op in asked if self.op(op) is not None]
        for op in chosen:
            stray = sorted(set(self.exact(SPECS[op])) - set(SPECS[op].compared()))
            if stray:
                raise ValueError(f"{self.name} declares EXACT[{op!r}] = {stray}, which {op} does not compare: its "
                                 f"compared tensors are {', '.join(SPECS[op].compared())}")
            beyond = sorted(self.clobbers(op) - set(SPECS[op].may_clobber))
            if beyond:
                allowed = ", ".join(SPECS[op].may_clobber) or "nothing"
                raise ValueError(f"{self.name} declares CLOBBERS[{op!r}] = {beyond}, which the op does not allow: an "
                                 f"implementation of {op} may overwrite {allowed}")
        return chosen

    def _near_misses(self, missing: list[str]) -> str:
        names = [n for n in dir(self.target) if not n.startswith("_")]
        hints = [f"{close[0]!r} is not {op!r}" for op in missing
                 if (close := difflib.get_close_matches(op, names, n=1, cutoff=0.75))]
        return f" ({'; '.join(hints)})" if hints else ""


# --- the built-in implementations, from the specs ---------------------------------------------------


def _hf():
    """Each spec's HF maths as the contract's callable; a raw kernel's buffers are its clobbers."""
    ops = {name: spec.contract_callable() for name, spec in SPECS.items()}
    clobbers = {name: set(spec.buffers_hold_outputs.values()) for name, spec in SPECS.items()
                if spec.buffers_hold_outputs}
    return SimpleNamespace(**ops, CLOBBERS=clobbers)


def scalar_inductor_on_a_default_cpu() -> None:
    """Inductor's C++ backend picks its vector instructions from the CPU, not from torch's own
    capability: under ATEN_CPU_CAPABILITY=default the ATen headers it includes declare no vector
    types, and every vectorised kernel fails to compile ("'at::vec' has not been declared"). Then
    it generates scalar code, as that capability means."""
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        import torch._inductor.config as inductor

        inductor.cpp.simdlen = 1


@functools.cache
def compile_every_case() -> None:
    """torch.compile as the harness uses it (``--impl compile``, the benchmark's peers): a graph for
    every case, never eager code in its place. Past dynamo's default of 8 recompiles of a function
    (a new rank, a size of 1, another layout or eps each recompile) torch.compile runs the function
    eagerly, with one log line: for 40 drawn rms_norm cases (CPU, derandomized draws) ``--impl
    compile`` compiled 11 graphs and judged HF's eager code in the cases past the limit; with the
    limits raised, 29 graphs. So the limits are raised far past what a run draws, and reaching one
    anyway is an error the case reports."""
    import torch._dynamo.config as dynamo

    for limit, value in (("recompile_limit", 1024), ("cache_size_limit", 1024),
                         ("accumulated_recompile_limit", 65536)):
        if hasattr(dynamo, limit):
            setattr(dynamo, limit, value)
    if hasattr(dynamo, "fail_on_recompile_limit_hit"):
        dynamo.fail_on_recompile_limit_hit = True


def _compile():
    """torch.compile of HF's maths for every autograd op; a raw kernel has no HF graph to compile."""
    scalar_inductor_on_a_default_cpu()
    compile_every_case()
    ops, lacking = {}, {}
    for name, spec in SPECS.items():
        if spec.differentiable:
            ops[name] = torch.compile(spec.reference, dynamic=True)
        else:
            lacking[name] = "a raw kernel has no HF counterpart to compile"
    return SimpleNamespace(**ops, LACKING=lacking)


def _kernels():
    """This repository's own kernels/, found beside the oracle package, and never another package
    named ``kernels`` (Hugging Face's hub-kernels library owns that import name once installed).
    Loaded as any ``--impl`` module is: the harness sets up the interpreter for it on a CPU."""
    return builtin_module("kernels")


def checkout_root() -> Path | None:
    """The repository this oracle/ was loaded from, or None where it is installed: a checkout has its
    pyproject.toml beside oracle/ and kernels/; an installed oracle/ sits in site-packages."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "kernels" / "__init__.py").is_file() else None


def builtin_module(name: str):
    """A module of this checkout (``kernels``), imported by name as an ``--impl`` module is, after
    checking that the import name finds the checkout's own package."""
    root = checkout_root()
    if root is None:
        raise ImplementationUnavailable(
            "this project's own kernels live in its repository and are not installed with the wheel (the import "
            "name `kernels` belongs to Hugging Face's hub-kernels library); run from a checkout, or pass "
            "--impl your.module:attr")
    spec = importlib.util.find_spec(name)
    found = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
    if found != root / name:
        raise ImplementationUnavailable(
            f"`import {name}` finds {found or 'nothing'}, not this checkout's {root / name}; run from the "
            "checkout's root, or put it first on PYTHONPATH")
    return prepared(name)


def prepared(module_name: str):
    """Import an implementation's module as the harness runs it: on a CPU its Triton kernels in the
    interpreter, made to compute as a GPU does (oracle/interpreter/), and autotuned kernels run one
    config per case (oracle/cases/autotune.py). Any exception while importing it becomes
    ImplementationUnavailable naming the module and the exception (a usage error, never a crash)."""
    try:
        module = interpreter.prepare_for(module_name)
    except ImplementationUnavailable:
        raise
    except DeclarationError as exc:  # implementation(...) misused at the module's top level
        raise DeclarationError(f"{module_name}: {exc}") from exc
    except ImportError as exc:
        raise ImplementationUnavailable(f"cannot import {module_name!r}: {exc}") from exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module: say which, not a traceback
        raise ImplementationUnavailable(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    autotune.install()
    return module


BUILTIN = {"kernels": _kernels, "hf": _hf, "compile": _compile}
# Vendors' adapters of the built-in ops, in this repository's peers/ (so from a checkout): a name for
# ``--impl`` -> "module:factory", the factory building the implementation (and raising
# ImplementationUnavailable where the vendor's package cannot run here).
ADAPTERS = {"liger": "peers.liger.builtin:adapter", "unsloth": "peers.unsloth.adapter:implementation",
            "unsloth-inplace": "peers.unsloth.adapter:inplace_implementation"}


def _adapter(name: str):
    module_name, factory = ADAPTERS[name].split(":")
    try:
        module = prepared(module_name)
    except ImplementationUnavailable as exc:
        if isinstance(exc.__cause__, ModuleNotFoundError) and (exc.__cause__.name or "").split(".")[0] == "peers":
            raise ImplementationUnavailable(f"--impl {name} is the adapter in this repository's peers/, which a "
                                            "wheel does not install; run from a checkout") from exc
        raise
    return getattr(module, factory)()


@functools.cache
def load(name: str) -> Implementation:
    """``kernels``, ``hf``, ``compile``, a vendor's adapter (``liger``, ...), or ``package.module:attr``
    (attr may be dotted). Kernel coverage hooks the Triton it brings, before any kernel launches."""
    loaded = _load(name)
    kernel_coverage.install()
    return loaded


def _load(name: str) -> Implementation:
    if name in BUILTIN:
        return Implementation(name, BUILTIN[name]())
    if name in ADAPTERS:
        return Implementation(name, _adapter(name))
    if ":" not in name:
        raise ValueError(f"unknown implementation {name!r}: use one of {', '.join([*BUILTIN, *ADAPTERS])} or "
                         "package.module:attr")
    module_name, attr = name.split(":", 1)
    # A module in the working directory is importable, as under ``python -m``: plain ``pytest``
    # does not put the directory on sys.path, and an author's implementation usually lives there.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    target = prepared(module_name)
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ValueError(f"{module_name!r} has no attribute {attr!r}") from exc
    try:
        implementation = Implementation(name, target)
    except DeclarationError as exc:
        raise DeclarationError(f"{name}: {exc}") from exc
    if len(implementation.lacking()) == len(SPECS):
        raise ValueError(f"{name} exposes none of the contract's ops ({', '.join(SPECS)})"
                         f"{implementation._near_misses(list(SPECS))}")
    return implementation
