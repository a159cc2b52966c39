"""A sweep worker: reads tasks as JSON lines on stdin, answers each with one JSON line on stdout.

Run by oracle/report/sweep.py as ``python -m oracle.report.worker --impl NAME``, one process per
worker, so that a crash (a segfault under the interpreter, an illegal address on a GPU) kills only
this process: the parent records the task it was running as a crash and starts a new worker.

Task:   {"id": n, "kind": "case", "case": {...}}  or  {"id": n, "kind": "check", "check": name, "case": {...}}
Answer: {"id": n, "result": CaseResult.to_dict()}  or  {"id": n, "findings": [...], "seconds": s},
        each with "kernel_coverage": the task's own kernel coverage (oracle/kernel_coverage,
        Recorder.to_json), which the parent merges: a worker that dies loses only its task's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

import torch

from oracle import kernel_coverage
from oracle.cases import Case
from oracle.engine import run_case
from oracle.declare.implementations import load
from oracle.declare.registry import SPECS
from oracle.declare.registry import load_declared


def _device() -> torch.device:
    chosen = os.environ.get("ORACLE_DEVICE")
    if chosen:
        device = torch.device(chosen)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device
    from oracle.engine.devices import default_device

    return default_device()


def serve(impl_name: str, stdin=sys.stdin, stdout=sys.stdout) -> None:
    from oracle.checks import aliasing

    load_declared()  # the run's declared ops (ORACLE_OP_MODULES, entry points)
    impl = load(impl_name)
    device = _device()
    for line in stdin:
        task = json.loads(line)
        case = Case(**task["case"])
        kernel_coverage.RECORDER.reset()  # what this task ran, alone
        if task["kind"] == "case":
            answer = {"id": task["id"], "result": run_case(case.op, case, impl, device).to_dict()}
        else:
            start = time.perf_counter()
            findings = aliasing.run_check(task["check"], SPECS[case.op], case, impl, device)
            answer = {"id": task["id"], "findings": [asdict(f) for f in findings],
                      "seconds": time.perf_counter() - start}
        answer["kernel_coverage"] = kernel_coverage.RECORDER.to_json()
        stdout.write(json.dumps(answer, default=str) + "\n")
        stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m oracle.report.worker")
    parser.add_argument("--impl", required=True)
    args = parser.parse_args()
    # Keep stdout for answers only: anything else printed (warnings, library chatter) goes to stderr.
    answers = sys.stdout
    sys.stdout = sys.stderr
    serve(args.impl, stdout=answers)


if __name__ == "__main__":
    main()
