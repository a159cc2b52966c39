"""Running a baseline and mutants, each in a process of its own forked from this one.

Note [A process per mutant]
    A mutant is a kernel file with one edit. It is imported in a child process, under the module's
    own name, through an import hook that serves the edited copy for that one module (the rest of
    the package is the user's, unchanged, and nothing on disk is touched). The process each child is
    forked from has imported the harness, torch and Triton but never the implementation (its
    kernels, its torch.library registrations), and never touched CUDA (on a GPU it is a fork
    server), so that each child starts clean and cheap. A mutant
    that crashes the process (a segfault under the interpreter, an illegal address on a GPU) or
    loops forever kills only its child: a crash or a timeout counts as detected, as it fails the
    user's suite. The child reports each item it starts, so that a crash names the case.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.util
import multiprocessing
import multiprocessing.connection
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from oracle.mutate.cases import Item
from oracle.mutate.mutants import Mutant


@dataclass
class Outcome:
    status: str  # "pass", "fail", "error", "crash", "timeout"
    item: int | None = None  # the item that failed (or was running)
    message: str = ""
    digests: dict[int, str] = field(default_factory=dict)  # item -> its outputs' bits, where it passed
    errors: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # item -> tensor_errors, where it passed
    checks: list[str] = field(default_factory=list)  # what failed: "verdict", a finding's check, "float64", ...
    seconds: float = 0.0


# --- in the child ----------------------------------------------------------------------------------

def _digest(run) -> str:
    """SHA-256 of the bits of every output and gradient an implementation produced in one case."""
    h = hashlib.sha256()
    for group in (run.outputs, run.grads):
        for name in sorted(group):
            t = group[name].detach().cpu().contiguous().reshape(-1)
            h.update(name.encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# Note [References made once]
#     A case's references (HF's evaluation, the float64 truth, the derived noise model, HF's other
#     order; engine.prepare) are most of a case's time outside the kernels: 5.9 of 6.7 s for twelve
#     stratified RMSNorm cases run by `hf` on the CPU. They depend on the case and on what the
#     implementation is granted (its maths, its saved activations), never on its kernels, so the
#     baseline saves each passing case's (torch.save, in the run's scratch folder) and every mutant
#     loads it rather than making it again. A case at scale (judged on a slice, whose Prepared holds a
#     closure) or one that cannot be saved is made each time, as before; so is one above
#     PREPARED_BYTES, whose file would cost more disk than its making costs time, or one past
#     KEPT_BYTES in all (a GPU machine's disk holds tens of GB; a GPU case up to 2^22 elements).
PREPARED_BYTES = 256 << 20
KEPT_BYTES = 8 << 30


def _prepared(spec, item: Item, impl, device, cache: Path | None):
    """The case's references (Note [References made once]): loaded from ``cache`` where the
    baseline saved them; made here where the baseline is to save them; else None (run_case makes
    them, and reports what making them raised)."""
    from oracle.cases import scale
    from oracle.engine import prepare

    if cache is None or scale.judged_on_a_slice(spec, item.case):
        return None
    if cache.exists():
        try:
            return torch.load(cache, map_location=device, weights_only=False)
        except Exception:  # noqa: BLE001 - unreadable: make them again
            return None
    try:
        return prepare(spec, item.case, device, maths=impl.maths(spec.name), saved=impl.saves_in_input_dtype(spec.name))
    except Exception:  # noqa: BLE001 - run_case makes them again and reports the error as the case's
        return None


def _keep(prepared, cache: Path | None) -> None:
    """Save a case's references for the mutants (Note [References made once]), where they can be."""
    if cache is None or prepared is None:
        return
    tensors = [t for t in _tensors_in(vars(prepared))]
    if sum(t.numel() * t.element_size() for t in tensors) > PREPARED_BYTES:
        return
    if sum(f.stat().st_size for f in cache.parent.glob("*.pt")) > KEPT_BYTES:
        return
    partial = cache.with_suffix(f".{os.getpid()}.partial")  # a mutant may keep one too, beside another
    try:
        torch.save(prepared, partial)
        partial.replace(cache)
    except Exception:  # noqa: BLE001 - a closure (a case at scale) or anything else pickle refuses
        partial.unlink(missing_ok=True)


def _tensors_in(value, depth: int = 0):
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 4 and isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v, depth + 1)
    elif depth < 4 and isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors_in(v, depth + 1)
    elif depth < 4 and hasattr(value, "__dataclass_fields__"):
        yield from _tensors_in(vars(value), depth + 1)


def tensor_errors(result) -> dict[str, list[float]]:
    """Per compared tensor of a judged case, [largest, mean] |k - t|: how far the implementation is
    from the float64 truth, for a survivor's precision beside the unmutated kernel's (score.py)."""
    return {v.name: [v.max_abs, v.mean_abs] for v in result.verdicts}


def run_item(item: Item, impl, device, cache: Path | None = None) -> tuple[str, str, str | None, list[str], dict]:
    """(status, the failure's first lines, the outputs' digest, the checks that failed, and where it
    passed its tensor_errors) of one item; ``cache``: where its references are kept (Note [References
    made once])."""
    from oracle.declare.registry import SPECS
    from oracle.engine import check_float64, run_case

    spec = SPECS[item.op]
    if item.kind == "float64":
        if not impl.takes_float64(spec.name):  # NO_FLOAT64: the suite skips the check too
            return "skipped", f"{impl.name} declares no float64 path for {spec.name}", None, [], {}
        try:
            check_float64(spec, item.case, impl, device)
        except Exception as exc:  # noqa: BLE001 - any failure of the check detects the mutant
            return "fail", " ".join(str(exc).split())[:300], None, ["float64"], {}
        return "pass", "", None, [], {}
    seen: dict[str, str] = {}
    saved_before = cache is not None and cache.exists()
    prepared = _prepared(spec, item, impl, device, cache)
    result = run_case(spec, item.case, impl, device, observe=lambda run: seen.update(digest=_digest(run)),
                      prepared=prepared)
    if result.status == "skipped":  # an op the implementation lacks
        return "skipped", result.error or "", None, [], {}
    if result.passed:
        if not saved_before:
            _keep(prepared, cache)
        return "pass", "", seen.get("digest"), [], tensor_errors(result)
    checks = (["verdict"] if any(not v.passed for v in result.verdicts) else []) + \
        sorted({finding.check for finding in result.findings})
    text = result.error or result.explain()
    return result.status, "\n".join(text.strip().splitlines()[:6]), None, checks or [result.status], {}


class _ServeMutant(importlib.abc.MetaPathFinder):
    """Imports one module from the mutant's edited copy; every other module as usual."""

    def __init__(self, module: str, path: Path, original: Path) -> None:
        self.module, self.path, self.original = module, path, original

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module:
            return None
        package = [str(self.original.parent)] if self.original.stem.startswith("__init__") else None
        return importlib.util.spec_from_file_location(fullname, self.path, submodule_search_locations=package)


def _install_mutant(mutant: Mutant, folder: Path) -> None:
    copy = folder / Path(mutant.file).name
    copy.write_text(mutant.source(), encoding="utf-8")
    top = mutant.module.split(".")[0]
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _ServeMutant(mutant.module, copy, Path(mutant.file)))


def _child(conn, kind: str, payload: dict) -> None:
    try:
        torch.set_num_threads(1)
        from oracle.declare.registry import load_declared
        from oracle.engine.devices import default_device

        load_declared(payload["op_modules"])
        # a kind is one of this module's works, or another module's work function (the gate's)
        work = kind if callable(kind) else {"baseline": baseline_work, "mutant": mutant_work}[kind]
        result = work(**{k: v for k, v in payload.items() if k != "op_modules"}, device=default_device(),
                      started=lambda index: conn.send(("item", index)))
        conn.send(("done", result))
    except BaseException:  # noqa: BLE001 - whatever happens is the parent's to report
        conn.send(("done", Outcome("error", message=traceback.format_exc(limit=-4))))
    finally:
        conn.close()


def _kept(cache: str | None, index: int) -> Path | None:
    return None if cache is None else Path(cache) / f"item-{index}.pt"


def baseline_work(items: list[Item], chosen: list[int], impl: str, device, started, cache: str | None = None) -> dict:
    """The unmutated implementation on ``chosen`` items: per item its outcome, the (kernel, line)
    pairs it ran and its time; and the kernels it launched (kernel coverage's records). Each passing
    item's references are kept in ``cache`` (Note [References made once])."""
    from oracle.declare.implementations import load
    from oracle.kernel_coverage import RECORDER, capture

    loaded = load(impl)
    answers = {}
    for index in chosen:
        started(index)
        begin = time.perf_counter()
        with capture() as lines:
            status, message, digest, _, errors = run_item(items[index], loaded, device, _kept(cache, index))
        answers[index] = {"status": status, "message": message, "digest": digest, "errors": errors,
                          "lines": sorted(lines), "seconds": time.perf_counter() - begin}
    kernels = RECORDER.to_json()
    files = {record["file"] for scope in kernels.values() for record in scope.values()}
    return {"items": answers, "kernels": kernels, "live": live_definitions(files)}


def live_definitions(files: set[str]) -> dict[str, dict[str, tuple[int, int]]]:
    """Per kernel file, the lines of each @triton.jit function its module holds under each name.

    Note [A definition the module does not use]
        A kernel file may define one helper twice in branches taken at import (``_tanh`` built from
        exp for the interpreter, libdevice's on a GPU). Where lines are traced (the interpreter) a
        mutant of the other definition is never reached; on a GPU nothing is traced, and by name
        alone every case of an op calling ``_tanh`` would run it, to come out bit-identical: on the
        H200, 16 such mutants took 1100 of the run's 3550 s of mutant work. So the baseline says
        which definition each name holds, and a mutant of another is not reached."""
    import inspect

    wanted = {os.path.realpath(f): f for f in files}  # keyed as kernel coverage names the file
    live = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or os.path.realpath(path) not in wanted:
            continue
        path = wanted[os.path.realpath(path)]
        spans = {}
        for name, value in list(vars(module).items()):
            fn = value
            for _ in range(4):  # an autotuner or heuristics wraps a JITFunction, which wraps the function
                fn = getattr(fn, "fn", fn) if not inspect.isfunction(fn) else fn
            if inspect.isfunction(fn) and fn is not value:
                try:
                    lines, first = inspect.getsourcelines(fn)
                except (OSError, TypeError):
                    continue
                spans[name] = (first, first + len(lines) - 1)
        live[path] = spans
    return live


@contextlib.contextmanager
def installed(mutant: Mutant, scratch: str):
    """The implementation's modules served with the mutant's edit from here on; its edited file
    lives in a folder under ``scratch``, which the parent removes in the end (a crashed child cannot)."""
    folder = Path(tempfile.mkdtemp(prefix=f"mutant-{mutant.number}-", dir=scratch))
    try:
        _install_mutant(mutant, folder)
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def mutant_work(mutant: Mutant, items: list[Item], order: list[int], impl: str, scratch: str, device,
                started, cache: str | None = None) -> Outcome:
    """The mutant on ``order``'s items until one fails, with the references the baseline kept."""
    with installed(mutant, scratch):
        return _judged_mutant(items, order, impl, device, started, cache)


def _judged_mutant(items: list[Item], order: list[int], impl: str, device, started, cache: str | None = None) -> Outcome:
    from oracle.declare.implementations import load

    loaded = load(impl)
    outcome = Outcome("pass")
    begin = time.perf_counter()
    for index in order:
        started(index)
        status, message, digest, checks, errors = run_item(items[index], loaded, device, _kept(cache, index))
        if status != "pass":
            outcome = Outcome(status, index, message, checks=checks)
            break
        outcome.digests[index] = digest
        outcome.errors[index] = errors
    outcome.seconds = time.perf_counter() - begin
    return outcome


# --- in the parent ---------------------------------------------------------------------------------

@dataclass
class _Running:
    process: multiprocessing.Process
    key: object
    deadline: float
    item: int | None = None


def _context(gpu: bool):
    """Fork from this process on a CPU; on a GPU from a fork server, a process that imported the
    harness but never touched CUDA (this one has asked CUDA how many devices there are, and CUDA
    does not survive a fork after that)."""
    if not gpu:
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["oracle.mutate.runner", "oracle.engine"])
    return context


def run_all(jobs: list[tuple[object, object, float]], workers: int, gpu: bool = False, progress=None,
            stop_at: float | None = None) -> dict:
    """Run each (key, make_job, timeout) in a child process, ``workers`` at a time; make_job() gives
    (kind, payload) for ``_child``. key -> the work's answer, or an Outcome for a crash or a timeout
    (Note [A process per mutant]). A job is made when its child starts, so that it can use what
    earlier answers taught. Past ``stop_at`` (time.monotonic()) no job starts: those left have no
    answer."""
    context = _context(gpu)
    pending, running, answers = list(jobs), {}, {}
    while pending or running:
        if stop_at is not None and time.monotonic() > stop_at:
            pending = []
        while pending and len(running) < workers:
            key, make_job, timeout = pending.pop(0)
            parent, child = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(child, *make_job()), daemon=True)
            process.start()
            child.close()
            running[parent] = _Running(process, key, time.monotonic() + timeout)
        for conn in multiprocessing.connection.wait(list(running), timeout=0.5):
            state = running[conn]
            try:
                kind, value = conn.recv()
            except EOFError:
                state.process.join()
                answers[state.key] = Outcome("crash", state.item, f"the process died (exit code {state.process.exitcode})")
                del running[conn]
                continue
            if kind == "item":
                state.item = value
                continue
            answers[state.key] = value
            state.process.join()
            del running[conn]
        now = time.monotonic()
        for conn, state in list(running.items()):
            if now > state.deadline:
                state.process.kill()
                state.process.join()
                answers[state.key] = Outcome("timeout", state.item, "ran past its time limit")
                del running[conn]
        if progress is not None:
            progress(answers)
    return answers


def default_workers(gpu: bool) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores)  # on a GPU too: a mutant's time goes to Triton's compiler and Python, on the cores
