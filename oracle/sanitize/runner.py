"""Running the target under compute-sanitizer: one subprocess per op and tool, several at once, each
with its full log kept, and the verdict on each run from its log and exit status.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from oracle.sanitize import findings as F

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
ERROR_EXITCODE = 86  # compute-sanitizer's exit status when it reported anything: no target exits with it
PRINT_LIMIT = 1000  # records printed per run (the summary still counts the rest): plenty to group
TIMEOUT_S = 1800  # per run: a hung target must not hang the command
LOG_DIR = Path("reports/out/sanitize")  # relative to the working directory, like the report's reports/out
CUDA_HOME_DEFAULT = Path("/usr/local/cuda")


def default_jobs() -> int:
    return min(8, os.cpu_count() or 1)


def find_compute_sanitizer(environ=None) -> Path | None:
    """compute-sanitizer on PATH, else in $CUDA_HOME/bin, else in /usr/local/cuda/bin; None if nowhere."""
    environ = os.environ if environ is None else environ
    found = shutil.which("compute-sanitizer", path=environ.get("PATH", ""))
    if found:
        return Path(found)
    for home in (environ.get("CUDA_HOME"), CUDA_HOME_DEFAULT):
        candidate = Path(home) / "bin" / "compute-sanitizer" if home else None
        if candidate and candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def command_line(sanitizer: Path, tool: str, impl: str, op: str) -> list[str]:
    return [str(sanitizer), "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), "--print-limit", str(PRINT_LIMIT),
            sys.executable, "-m", "oracle.sanitize.target", "--impl", impl, "--op", op]


def target_environment(environ=None) -> dict[str, str]:
    """The caller's environment, with torch's caching allocator off: every tensor is then a
    cudaMalloc of its own, and an access past its end falls outside any allocation."""
    return {**(os.environ if environ is None else environ), "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}


def log_path(log_dir: Path, impl: str, op: str, tool: str) -> Path:
    slug = re.sub(r"[^\w.-]+", "_", impl)
    return Path(log_dir) / f"{slug}-{op}-{tool}.log"


@dataclass
class Run:
    """One op under one tool: clean, findings, or error (the run failed and no record says why)."""

    op: str
    tool: str
    status: str  # clean | findings | error
    seconds: float
    log: Path
    cases: int | None = None
    findings: list[F.Finding] = field(default_factory=list)
    error: str = ""
    tail: list[str] = field(default_factory=list)  # the target's last lines, for an error
    command: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"op": self.op, "tool": self.tool, "status": self.status, "seconds": round(self.seconds, 2),
                "log": str(self.log), "cases": self.cases, "findings": [f.to_dict() for f in self.findings],
                "error": self.error, "tail": self.tail, "command": self.command}


def judge(op: str, tool: str, log: Path, output: F.Output, returncode: int | None, seconds: float) -> Run:
    """Findings whenever a record (or the summary) reports one, whatever the exit status; clean only
    when the target ran every case and the sanitizer counted nothing; anything else is an error."""
    run = Run(op, tool, "findings", seconds, log, output.cases_run, output.findings())
    if run.findings:
        return run
    if returncode == 0 and output.summary_errors == 0 and output.cases_run is not None:
        run.status = "clean"
        return run
    run.status = "error"
    run.tail = output.tail()
    during = f" during case {output.last_case}" if output.last_case and output.cases_run is None else ""
    if returncode is None:
        run.error = f"timed out after {seconds:.0f} s{during}"
    elif returncode < 0:
        run.error = f"killed by signal {-returncode}{during}"
    elif returncode:
        run.error = f"the target failed (exit {returncode}){during}"
    elif output.summary_errors is None:
        run.error = "compute-sanitizer printed no summary"
    else:
        run.error = "the target stopped before its last case"
    return run


class _Processes:
    """The sanitizer processes running now, so that an interrupted command stops them all (each
    leads a process group of its own: the sanitizer and the target under it)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live: set[subprocess.Popen] = set()
        self.stopping = False

    def start(self, command: list[str], log, env: dict) -> subprocess.Popen | None:
        with self.lock:
            if self.stopping:
                return None
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            self.live.add(process)
            return process

    def done(self, process: subprocess.Popen) -> None:
        with self.lock:
            self.live.discard(process)

    def stop(self, process: subprocess.Popen | None = None) -> None:
        with self.lock:
            self.stopping = self.stopping or process is None
            for victim in [process] if process else list(self.live):
                try:
                    os.killpg(victim.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def run_one(processes: _Processes, sanitizer: Path, impl: str, op: str, tool: str, log_dir: Path,
            timeout: float = TIMEOUT_S) -> Run:
    log = log_path(log_dir, impl, op, tool)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = command_line(sanitizer, tool, impl, op)
    start = time.perf_counter()
    with open(log, "w") as handle:
        process = processes.start(command, handle, target_environment())
        if process is None:
            return Run(op, tool, "error", 0.0, log, error="not started: the command was interrupted", command=command)
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            processes.stop(process)
            process.wait()
            returncode = None
        finally:
            processes.done(process)
    run = judge(op, tool, log, F.parse(log.read_text(errors="replace")), returncode, time.perf_counter() - start)
    run.command = command
    return run


def run_all(sanitizer: Path, impl: str, ops: list[str], tools: list[str], jobs: int, log_dir: Path = LOG_DIR,
            on_done: Callable[[Run], None] = lambda run: None) -> list[Run]:
    """Every (op, tool) in its own sanitizer process, ``jobs`` at a time; the runs in (op, tool) order."""
    pairs = [(op, tool) for op in ops for tool in tools]
    processes = _Processes()
    runs: dict[tuple[str, str], Run] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_one, processes, sanitizer, impl, op, tool, log_dir) for op, tool in pairs]
        try:
            for future in as_completed(futures):
                run = future.result()
                runs[(run.op, run.tool)] = run
                on_done(run)
        except BaseException:  # Ctrl-C included: no sanitizer process outlives the command
            for future in futures:
                future.cancel()
            processes.stop()
            raise
    return [runs[pair] for pair in pairs]
