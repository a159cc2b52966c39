"""The report's sweep: which cases and checks run, and a pool of worker processes that runs them.

The grid is each spec's fixed, seeded ``sweep(full)`` (specs.py), so two runs of the same code on
the same platform compare cell by cell; ``--scale`` adds each spec's scale grid (the sizes people
train at, oracle/cases/scale.py). The aliasing checks run on one case per op and dtype (the smallest of
the grid, never one of the scale grid), since each check needs graphs of its own.

Workers are subprocesses (oracle/report/worker.py): a crash kills one worker, not the run. The
task it was running is recorded as a crash with its repro command, and a fresh worker takes over.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from oracle.checks import aliasing
from oracle.cases import scale
from oracle.cases import Case
from oracle.engine import repro_command
from oracle.declare.registry import SPECS
from oracle.engine.watchdog import time_limit_s


def columns_of(case: Case) -> int | None:
    """The size a row-wise kernel iterates over (RMSNorm's columns, RoPE's head_dim, SwiGLU's last dim)."""
    dims = case.dims
    return dims.get("cols") or dims.get("head_dim") or (dims["shape"][-1] if "shape" in dims else None)

def task_timeout_s() -> float:
    """The backstop of the worker's own time limit (oracle/engine/watchdog.py): past it, the worker is
    killed and its task recorded as a crash (a worker that hangs outside any case, say)."""
    limit = time_limit_s()
    return 2 * limit + 60 if limit > 0 else 3600


@dataclass(frozen=True)
class Task:
    id: int
    kind: str  # case | check
    case: Case
    check: str | None = None

    def message(self) -> str:
        return json.dumps({"id": self.id, "kind": self.kind, "case": self.case.record(), "check": self.check})

    @property
    def label(self) -> str:
        return f"{self.case.op} {self.case.dtype}" + (f" [{self.check}]" if self.check else "")


def grid_name(full: bool, at_scale: bool) -> str:
    """The document's ``sweep``: which grid ran ("quick", "full", "full+scale", ...)."""
    return ("full" if full else "quick") + ("+scale" if at_scale else "")


def plan(full: bool, ops: list[str] | None = None, dtypes: list[str] | None = None,
         variants: list[str] | None = None, checks: bool = True, at_scale: bool = False) -> list[Task]:
    tasks: list[Task] = []
    for name, spec in SPECS.items():
        if ops is not None and name not in ops:
            continue

        def wanted(c):
            return (not dtypes or c.dtype in dtypes) and (not variants or c.variant in variants)

        cases = [c for c in spec.sweep(full) if wanted(c)]
        tasks += [Task(len(tasks) + i, "case", case) for i, case in enumerate(cases)]
        if at_scale:
            tasks += [Task(len(tasks) + i, "case", case) for i, case in enumerate(filter(wanted, spec.scale()))]
        if not checks:
            continue
        for dtype in dict.fromkeys(c.dtype for c in cases):
            # The smallest case with a real row (>= 8 columns): cheap, yet not a degenerate shape.
            candidates = [c for c in cases if c.dtype == dtype]
            wide = [c for c in candidates if (columns_of(c) or 0) >= 8] or candidates
            smallest = min(wide, key=_size)
            for check in aliasing.applicable(spec):
                tasks.append(Task(len(tasks), "check", smallest, check))
    return tasks


def _next_task(queues) -> Task | None:
    for todo in queues:
        try:
            return todo.get_nowait()
        except queue.Empty:
            continue
    return None


def _needs_the_gpu_alone(task: Task) -> bool:
    return task.kind == "case" and scale.needs_the_gpu_alone(SPECS[task.case.op], task.case)


def _size(case: Case) -> int:
    size = 1
    for value in case.dims.values():
        for v in value if isinstance(value, list) else [value]:
            size *= v
    return size


def default_workers() -> list[str | None]:
    """Devices for the workers: every GPU twice (overlap Python with kernels), or the CPU cores."""
    from oracle.engine.devices import native_gpu

    if native_gpu():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())] * 2
    return [None] * max(1, min(os.cpu_count() or 1, 8))


class _Worker:
    def __init__(self, impl: str, device: str | None, threads: int):
        self.impl, self.device, self.threads = impl, device, threads
        self.proc: subprocess.Popen | None = None
        self.stderr = None
        self.start()

    def start(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "PYTHONUNBUFFERED": "1"}
        if self.device:
            env["ORACLE_DEVICE"] = self.device
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "oracle.report.worker", "--impl", self.impl],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, env=env)

    def ask(self, task: Task) -> dict | None:
        """The worker's answer, or None if it died (or hung past task_timeout_s() and was killed)."""
        watchdog = threading.Timer(task_timeout_s(), self.proc.kill)
        watchdog.start()
        try:
            self.proc.stdin.write(task.message() + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        finally:
            watchdog.cancel()
        return json.loads(line) if line else None

    def death_notice(self) -> str:
        code = self.proc.wait()
        self.stderr.seek(0)
        tail = self.stderr.read()[-2000:]
        return f"the worker process died (exit code {code}) while running this task\n{tail}"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def crash_answer(task: Task, impl: str, notice: str) -> dict:
    """The answer recorded for a task whose worker died: a crash, with the command that reruns it."""
    repro = repro_command(task.case, impl, task.check)
    if task.kind == "case":
        return {"id": task.id, "result": {"case": task.case.record(), "impl": impl, "status": "crash", "verdicts": [],
                                          "findings": [], "error": notice, "seconds": 0.0, "repro": repro}}
    return {"id": task.id, "seconds": 0.0, "findings": [
        {"check": task.check, "tensor": task.case.op, "phase": "-", "message": f"crash: {notice}",
         "index": None, "expected": None, "found": None}]}


def run(tasks: list[Task], impl: str, devices: list[str | None],
        on_answer: Callable[[Task, dict], None] | None = None) -> dict[int, dict]:
    """Run every task on a pool of workers; answers by task id (a crash never loses the others)."""
    # Large cases take their GPU one at a time (scale.one_at_a_time): the first worker of each GPU
    # works through them first while the others run the small cases, then all take what is left.
    large, small = queue.Queue(), queue.Queue()
    for task in tasks:
        (large if _needs_the_gpu_alone(task) else small).put(task)
    answers: dict[int, dict] = {}
    lock = threading.Lock()
    threads_each = max(1, (os.cpu_count() or 1) // max(1, len(devices)))

    def serve(device, queues):
        worker = _Worker(impl, device, threads_each)
        while True:
            task = _next_task(queues)
            if task is None:
                break
            answer = worker.ask(task)
            if answer is None:
                answer = crash_answer(task, impl, worker.death_notice())
                worker.start()
            with lock:
                answers[task.id] = answer
                if on_answer:
                    on_answer(task, answer)
        worker.stop()

    chosen = devices[:max(1, len(tasks))]
    firsts = {chosen.index(device) for device in chosen}  # each device's first worker
    threads = [threading.Thread(target=serve, args=(device, (large, small) if i in firsts else (small, large)),
                                daemon=True) for i, device in enumerate(chosen)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(timeout=0.5)
    return answers

