"""Where the harness finds ops: its own op modules (oracle/ops/) and declarations from anywhere else.

Note [Finding declared ops]
    A declaration (``oracle.declare.Op``, or an ``OpSpec``) lives in any importable module. The
    harness registers every one a module holds at its top level (names without a leading
    underscore), the way pytest collects tests, from

    - ``--op-module package.module`` (pytest, ``python -m oracle.report``, ``python -m oracle.repro``;
      repeatable), or the ini option ``oracle_op_modules`` (one module per line);
    - the entry-point group ``kernel_oracle.ops`` of installed packages (each entry names a module,
      or one declaration or a list of them with ``module:attr``), always;
    - ``ORACLE_OP_MODULES`` (comma-separated), which the two above also set, so that the worker
      processes a run starts (the report's, xdist's) find the same ops.

    Registered, a declared op is in ``oracle.declare.registry.SPECS`` like a built-in one, and everything that
    enumerates the registry (the generic suite, the report, the gate, ``--impl hf``/``compile``)
    covers it. Two declarations of one name are an error that names both places.

    A plain script (no pytest, no command line) calls ``load_declarations("mylib.declared")``.

    Anything wrong in a module of declarations (an exception while importing it, a malformed ``Op``,
    no declaration at all) is a ``DeclarationError`` (oracle.declare's, the one error class) that
    names the module, and, for an exception raised in it, the line. pytest turns it into a usage
    error, the command-line tools into exit status 2 with the message: never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from importlib import metadata
from pathlib import Path

from oracle import interpreter
from oracle.declare.op import Op
from oracle.declare.spec import OpSpec
from oracle.errors import DeclarationError

# What other modules use (``load_declarations`` and ``SPECS`` are re-exported by ``oracle``, where a
# user's code imports them); the rest is internal.
__all__ = ["ENTRY_POINT_GROUP", "ENVIRONMENT", "ORIGINS", "SPECS", "DeclarationError", "load_declarations",
           "load_declared", "load_op_modules", "register", "where"]

ENTRY_POINT_GROUP = "kernel_oracle.ops"
ENVIRONMENT = "ORACLE_OP_MODULES"

# op name -> the module that declared it, for ops from --op-module / ORACLE_OP_MODULES (what a
# repro command must load again); built-in and entry-point ops load by themselves.
ORIGINS: dict[str, str] = {}
# Every op the harness knows, by name: the built-in ones first, then the declared ones as they load.
SPECS: dict[str, OpSpec] = {}
_WHERE: dict[str, str] = {}
_LOADED: set[str] = set()
# The built-in ops' package, loaded by name as any module of declarations is: the core imports it nowhere.
BUILTIN_OPS = "oracle.ops"


def register(declaration, where: str) -> OpSpec:
    """Add one declaration (an ``oracle.declare.Op`` or an ``OpSpec``) to the registry."""
    spec = _as_spec(declaration)
    if spec.name in SPECS:
        if SPECS[spec.name] is spec:
            return spec
        raise DeclarationError(f"op {spec.name!r} is declared twice: in {_WHERE[spec.name]} and in {where}")
    SPECS[spec.name] = spec
    _WHERE[spec.name] = where
    return spec


def where(op: str) -> str:
    """The module an op was declared in."""
    return _WHERE[op]


def load_op_modules(names) -> list[str]:
    """Import each module and register its declarations; returns the ops they added. Remembered in
    ORACLE_OP_MODULES for the processes this one starts."""
    added = []
    for name in [n.strip() for n in names if n and n.strip()]:
        if name in _LOADED:
            continue
        ops = _load_module(name)
        ORIGINS.update(dict.fromkeys(ops, name))
        added += ops
        _LOADED.add(name)
    if _LOADED:
        os.environ[ENVIRONMENT] = ",".join(sorted(_LOADED))
    return added


def load_declared(extra=()) -> list[str]:
    """Everything declared outside oracle/ops/: entry points, ORACLE_OP_MODULES, then ``extra``."""
    added = _load_entry_points()
    added += load_op_modules(os.environ.get(ENVIRONMENT, "").split(","))
    return added + load_op_modules(extra)


def load_declarations(*modules: str) -> list[str]:
    """Register the declarations of ``modules`` (and, as every tool does, those of installed
    packages' entry points and of ORACLE_OP_MODULES), for a plain script::

        from oracle import load_declarations
        ops = load_declarations("mylib.declared")  # -> ["layer_norm", ...]

    Then ``oracle.SPECS`` holds them, ``oracle.load("mylib.impls:impl")`` checks an
    implementation of them, and ``oracle.run_case`` judges a case. Returns the ops the named
    modules declare (loaded now or before); loading a module twice registers it once. Raises
    DeclarationError naming the module for anything wrong in it."""
    stray = [m for m in modules if not isinstance(m, str) or not m.strip()]
    if stray:
        raise DeclarationError(f"load_declarations: each argument is a module's name (\"mylib.declared\"), got "
                               f"{stray[0]!r}")
    load_declared(modules)
    wanted = {m.strip() for m in modules}
    return [op for op, origin in ORIGINS.items() if origin in wanted]


def _load_module(name: str) -> list[str]:
    if os.getcwd() not in sys.path:  # as under python -m: a module of the working directory imports
        sys.path.insert(0, os.getcwd())
    # A module may hold Triton kernels beside its declarations: they are decorated as it is imported,
    # so the interpreter is chosen first, as for an implementation's module (oracle/interpreter/).
    interpreter.choose_backend()
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):  # it (or its package) is not there
            raise DeclarationError(f"op module {name}: cannot import it: {exc}") from exc
        raise DeclarationError(f"op module {name}: cannot import it: {exc}{_raised_in(exc, name)}") from exc
    except DeclarationError as exc:
        raise DeclarationError(f"op module {name}: {exc}{_raised_in(exc, name)}") from exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module: say which, not a traceback
        raise DeclarationError(f"op module {name}: importing it raised {type(exc).__name__}: {exc}"
                               f"{_raised_in(exc, name)}") from exc
    found = _declarations_in(module)
    if not found:
        raise DeclarationError(f"op module {name}: it holds no declaration (an oracle.declare.Op or an OpSpec "
                               "at its top level)")
    try:
        return [register(declaration, name).name for declaration in found]
    except DeclarationError as exc:
        raise DeclarationError(f"op module {name}: {exc}") from exc


def _raised_in(exc: BaseException, module: str) -> str:
    """`` (at path:line)``: the last line of the module's own file (or failing that, of any file
    outside the harness and the import machinery) that the exception passed through."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    own = str(Path(spec.origin).resolve()) if spec is not None and spec.origin else None
    harness = str(Path(__file__).resolve().parent)
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if own and str(Path(f.filename).resolve()) == own]
    outside = [f for f in frames if not f.filename.startswith("<") and
               not str(Path(f.filename).resolve()).startswith(harness)]
    frame = (mine or outside or [None])[-1]
    return f" (at {frame.filename}:{frame.lineno})" if frame is not None else ""


_ENTRY_POINTS_LOADED = False


def _load_entry_points() -> list[str]:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return []
    _ENTRY_POINTS_LOADED = True
    added = []
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a broken package must say which, not kill the run silently
            raise DeclarationError(f"entry point {entry.name} = {entry.value} ({ENTRY_POINT_GROUP}): cannot load it: "
                                   f"{type(exc).__name__}: {exc}") from exc
        found = _declarations_in(loaded) if isinstance(loaded, type(os)) else \
            list(loaded) if isinstance(loaded, (list, tuple)) else [loaded]
        origin = f"{entry.value} (entry point {entry.name})"
        try:
            added += [register(declaration, origin).name for declaration in found]
        except DeclarationError as exc:
            raise DeclarationError(f"{origin}: {exc}") from exc
    return added


def _declarations_in(module) -> list:
    found = []
    for attr, value in vars(module).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, (Op, OpSpec)):
            found.append(value)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, (Op, OpSpec)) for v in value):
            found.extend(value)
    unique = {id(d): d for d in found}  # one declaration bound to two names counts once
    return list(unique.values())


def _as_spec(declaration) -> OpSpec:
    if isinstance(declaration, OpSpec):
        return declaration
    if isinstance(declaration, Op):
        return declaration.spec
    raise DeclarationError(f"{declaration!r} is not a declaration (an oracle.declare.Op or an OpSpec)")


def _register_builtins() -> None:
    for module in importlib.import_module(BUILTIN_OPS).MODULES:
        for spec in module.SPECS:
            register(spec, module.__name__)


_register_builtins()
