"""A time limit on every case and check, so that a kernel that never finishes (a loop that does not
end, a heap corrupted into a deadlock, a GPU kernel that spins) becomes a verdict, and a run ends
in bounded time.

- Soft: at the limit, SIGALRM raises ``CaseTimeout`` in the main thread. That catches a hang in
  Python, which is where the CPU interpreter runs kernels: the case becomes an error with its
  traceback, and the run goes on.
- Hard: if the case is still running a grace period later (stuck in C, such as a GPU
  synchronisation that never returns), the process prints which case and every thread's stack,
  then exits with EXIT_HUNG. pytest-xdist and the report's worker pool treat that like any other
  crash: the case is recorded with its repro command and a fresh worker carries on.

The limit is ``ORACLE_CASE_TIMEOUT`` seconds (default 300; 0 turns it off). The slowest cases
measured take seconds: the first launch of a kernel on a GPU compiles it, and the largest
interpreter cases run for under a minute.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
from oracle.errors import CaseTimeout  # noqa: F401 - raised here

EXIT_HUNG = 70
GRACE_S = 30.0


def time_limit_s() -> float:
    return float(os.environ.get("ORACLE_CASE_TIMEOUT", "300"))



@contextlib.contextmanager
def time_limit(label: str, seconds: float | None = None):
    """Run the body under the soft and hard limits; ``label`` names the case in messages."""
    seconds = time_limit_s() if seconds is None else seconds
    if seconds <= 0:
        yield
        return
    soft = threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")
    if soft:
        def expire(signum, frame):
            raise CaseTimeout(f"{label} ran past the time limit of {seconds:g} s (ORACLE_CASE_TIMEOUT)")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    hard = threading.Timer(seconds + min(GRACE_S, seconds), _abandon, args=(label, seconds))
    hard.daemon = True
    hard.start()
    try:
        yield
    finally:
        hard.cancel()
        if soft:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _abandon(label: str, seconds: float) -> None:
    sys.stderr.write(f"\nkernel-oracle: {label} is still running {seconds:g} s past its start and did not "
                     "stop when told; ending this process (its case is recorded as hung)\n")
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(EXIT_HUNG)
