"""compute-sanitizer in the harness: ``python -m oracle.sanitize --impl NAME`` runs every op of an
implementation on the report's quick grid under memcheck, racecheck, initcheck and synccheck, one
process per op and tool, and reports each distinct finding.

The differential engine sees a write outside a tensor through its guard bands; it cannot see a read
there, a shared-memory race, a read of memory nothing wrote, or a misused barrier. The sanitizer
sees all of them in device code, so it runs on a GPU only.

- ``target.py``: the program run under the sanitizer (each case on tensors in exactly-sized storage);
- ``runner.py``: the sanitizer processes, their logs, and the verdict on each run;
- ``findings.py``: reading compute-sanitizer's output;
- ``__main__.py``: the command line.
"""

from __future__ import annotations

from oracle.sanitize.findings import Finding, parse
from oracle.sanitize.runner import TOOLS, Run, find_compute_sanitizer, run_all

__all__ = ["TOOLS", "Finding", "Run", "find_compute_sanitizer", "parse", "run_all"]
