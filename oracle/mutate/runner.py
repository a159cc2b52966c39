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


def run_item(item: Item, impl, device) -> tuple[str, str, str | None, list[str]]:
    """(status, the failure's first lines, the outputs' digest, the checks that failed) of one item."""
    from oracle.declare.registry import SPECS
    from oracle.engine import check_float64, run_case

    spec = SPECS[item.op]
    if item.kind == "float64":
        if not impl.takes_float64(spec.name):  # NO_FLOAT64: the suite skips the check too
            return "skipped", f"{impl.name} declares no float64 path for {spec.name}", None, []
        try:
            check_float64(spec, item.case, impl, device)
        except Exception as exc:  # noqa: BLE001 - any failure of the check detects the mutant
            return "fail", " ".join(str(exc).split())[:300], None, ["float64"]
        return "pass", "", None, []
    seen: dict[str, str] = {}
    result = run_case(spec, item.case, impl, device, observe=lambda run: seen.update(digest=_digest(run)))
    if result.status == "skipped":  # an op the implementation lacks
        return "skipped", result.error or "", None, []
    if result.passed:
        return "pass", "", seen.get("digest"), []
    checks = (["verdict"] if any(not v.passed for v in result.verdicts) else []) + \
        sorted({finding.check for finding in result.findings})
    text = result.error or result.explain()
    return result.status, "\n".join(text.strip().splitlines()[:6]), None, checks or [result.status]


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


def baseline_work(items: list[Item], chosen: list[int], impl: str, device, started) -> dict:
    """The unmutated implementation on ``chosen`` items: per item its outcome, the (kernel, line)
    pairs it ran and its time; and the kernels it launched (kernel coverage's records)."""
    from oracle.declare.implementations import load
    from oracle.kernel_coverage import RECORDER, capture

    loaded = load(impl)
    answers = {}
    for index in chosen:
        started(index)
        begin = time.perf_counter()
        with capture() as lines:
            status, message, digest, _ = run_item(items[index], loaded, device)
        answers[index] = {"status": status, "message": message, "digest": digest, "lines": sorted(lines),
                          "seconds": time.perf_counter() - begin}
    return {"items": answers, "kernels": RECORDER.to_json()}


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
                started) -> Outcome:
    """The mutant on ``order``'s items until one fails."""
    with installed(mutant, scratch):
        return _judged_mutant(items, order, impl, device, started)


def _judged_mutant(items: list[Item], order: list[int], impl: str, device, started) -> Outcome:
    from oracle.declare.implementations import load

    loaded = load(impl)
    outcome = Outcome("pass")
    begin = time.perf_counter()
    for index in order:
        started(index)
        status, message, digest, checks = run_item(items[index], loaded, device)
        if status != "pass":
            outcome = Outcome(status, index, message, checks=checks)
            break
        outcome.digests[index] = digest
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
