"""Where a ``pytest -n N -v`` session's wall time goes, worker by worker.

    pytest -n auto -v ... | python scripts/worker_timeline.py stamp > run.log   # each line: seconds since start
    python scripts/worker_timeline.py summary run.log

``summary`` reads the stamped log's result lines (``[gw3] [ 45%] PASSED tests/...``): when each
worker reported its first and last result, and the longest gaps between a worker's results (a gap
is one test's setup, call and teardown, or a worker waiting). The suite is CPU-bound on the GPU
machine (docs/howto/gpu-scale-and-sanitizer.md), so start-up, the tail and idle workers are what
is left to win once the tests themselves are cheap.
"""

from __future__ import annotations

import re
import sys
import time
from collections import defaultdict

RESULT = re.compile(r"^\s*([\d.]+) \[(gw\d+)\] \[\s*\d+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+)")


def stamp() -> None:
    start = time.monotonic()
    for line in sys.stdin:
        sys.stdout.write(f"{time.monotonic() - start:8.1f} {line}")
        sys.stdout.flush()


def summary(path: str, gaps: int = 12) -> None:
    results = defaultdict(list)  # worker -> [(seconds, test)]
    with open(path, encoding="utf-8", errors="replace") as log:
        for line in log:
            match = RESULT.match(line)
            if match:
                results[match.group(2)].append((float(match.group(1)), match.group(4)))
    if not results:
        sys.exit(f"{path}: no stamped xdist result lines (run pytest -n N -v through `stamp`)")
    firsts = [times[0][0] for times in results.values()]
    lasts = [times[-1][0] for times in results.values()]
    print(f"{len(results)} workers, {sum(map(len, results.values()))} results; first result {min(firsts):.1f}-"
          f"{max(firsts):.1f} s, last {min(lasts):.1f}-{max(lasts):.1f} s")
    for worker in sorted(results, key=lambda w: int(w[2:])):
        times = results[worker]
        print(f"  {worker:>5}: {len(times):4d} results, first {times[0][0]:6.1f} s, last {times[-1][0]:6.1f} s")
    spans = sorted(((t - before, worker, test) for worker, times in results.items()
                    for (before, _), (t, test) in zip([(0.0, "")] + times, times)), reverse=True)
    print(f"longest {gaps} spans between a worker's results (from 0 for its first):")
    for seconds, worker, test in spans[:gaps]:
        print(f"  {seconds:6.1f} s {worker:>5} ending {test}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["stamp"]:
        stamp()
    elif sys.argv[1:2] == ["summary"] and len(sys.argv) == 3:
        summary(sys.argv[2])
    else:
        sys.exit(__doc__)
