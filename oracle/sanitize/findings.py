"""Reading compute-sanitizer's text output: its records, the tool's summary count, and what the
target printed.

Every line compute-sanitizer writes starts with ``=========``. A record (one error or hazard) starts
at such a line whose text is not indented: ``Invalid __global__ write of size 8 bytes``, ``Program
hit cudaErrorLaunchFailure ...``, ``Error: Race reported between ...``. The indented lines after it
are its details; ``at KERNEL+OFFSET in FILE:LINE`` says where it happened (racecheck names the place
in the record itself and the other side of the race on an ``and ... access at`` line). The banner,
the summaries and the sanitizer's notes on how the target ended are not records. Lines without the
prefix are the target's own output: ``case: LABEL`` before each case, ``cases: N`` at the end
(oracle/sanitize/target.py), or a traceback.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

PREFIX = "========="
# The sanitizer's own lines that are not records: its banner, and how the target ended (a crash
# with no record is a failed run, not a finding).
NOT_RECORDS = (
    "COMPUTE-SANITIZER",
    "Target application returned an error",
    "Error: process didn't terminate successfully",
    "Error: Target application terminated before first instrumented API call",
    "Internal Sanitizer Error",
)
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: ([\d,]+) errors?$")
_NOT_PRINTED = re.compile(r"ERROR SUMMARY: ([\d,]+) errors? were not printed")
_RACECHECK_SUMMARY = re.compile(r"RACECHECK SUMMARY: [\d,]+ hazards? displayed \(([\d,]+) errors?, ([\d,]+) warnings?\)")
_HAZARD_COUNT = re.compile(r"\s*\[[\d,]+ hazards?\]$")
_CASES_RUN = re.compile(r"cases: (\d+)$")
CASE_MARK = "case: "
AUTOTUNED_MARK = "autotuned: "  # the configs a case ran (in the run's log; the case's repro runs the same)
# Details kept as an example of a finding: not the host backtrace, which is the same for every record.
_BACKTRACE = ("Host Frame:", "Device Frame:", "Saved host backtrace")
_ACCESS = re.compile(r"(Invalid|Misaligned|Uninitialized|Out-of-range) ")


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass
class Record:
    message: str
    location: str | None = None  # KERNEL+OFFSET in FILE:LINE
    case: str | None = None  # the label of the case the target was running
    details: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    """A distinct problem: records with the same message and location, counted; or errors the
    summary counts that no record shows (``from_summary``)."""

    message: str
    location: str | None
    count: int
    first_case: str | None = None
    example: tuple[str, ...] = ()  # the first record's details
    from_summary: bool = False

    def describe(self) -> str:
        if self.from_summary:
            return self.message
        where = f" at {self.location}" if self.location else ""
        one, many = ("access", "accesses") if _ACCESS.match(self.message) else ("report", "reports")
        return f"{self.message}{where} ({self.count} {one if self.count == 1 else many})"

    def to_dict(self) -> dict:
        return {"message": self.message, "location": self.location, "count": self.count,
                "first_case": self.first_case, "example": list(self.example), "from_summary": self.from_summary}


@dataclass
class Output:
    """One run's output, read: the records, the summary's count and what the target said."""

    records: list[Record] = field(default_factory=list)
    summary_errors: int | None = None  # None: no summary line (the sanitizer never finished)
    not_printed: int = 0  # errors past --print-limit
    cases_run: int | None = None  # the target's closing "cases: N"; None: it never got there
    last_case: str | None = None
    target_lines: list[str] = field(default_factory=list)  # the target's own output, less the case marks
    notes: list[str] = field(default_factory=list)  # the sanitizer's lines about how the target ended

    def findings(self) -> list[Finding]:
        """Records grouped by message and location, in order of first appearance, then what the
        summary counts beyond the records shown."""
        counts = Counter((r.message, r.location) for r in self.records)
        first: dict[tuple, Record] = {}
        for record in self.records:
            first.setdefault((record.message, record.location), record)
        out = [Finding(r.message, r.location, counts[key], r.case, tuple(r.details)) for key, r in first.items()]
        unexplained = (self.summary_errors or 0) - len(self.records)
        if unexplained > 0:
            message = (f"{unexplained} more error(s) not printed (past --print-limit)" if self.not_printed >= unexplained
                       else f"{unexplained} error(s) in the sanitizer's summary that no record shows")
            out.append(Finding(message, None, unexplained, self.last_case, from_summary=True))
        return out

    def tail(self, lines: int = 6) -> list[str]:
        """The last lines the target printed (its traceback, when it failed), then the sanitizer's notes."""
        return self.target_lines[-lines:] + self.notes


def parse(text: str) -> Output:
    out = Output()
    record: Record | None = None
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            _target_line(out, line.rstrip())
            continue
        body = line[len(PREFIX):].removeprefix(" ").rstrip()
        if not body.strip():  # the blank line that ends a record
            record = None
        elif body[0].isspace():
            if record is not None:
                _detail(record, body.strip())
        else:
            record = _top_line(out, body)
    return out


def _target_line(out: Output, line: str) -> None:
    if line.startswith(CASE_MARK):
        out.last_case = line[len(CASE_MARK):]
    elif match := _CASES_RUN.fullmatch(line):
        out.cases_run = int(match.group(1))
    elif line and not line.startswith(AUTOTUNED_MARK):
        out.target_lines.append(line)


def _top_line(out: Output, body: str) -> Record | None:
    """A record, or (returning None) a summary or a note."""
    if match := _NOT_PRINTED.match(body):
        out.not_printed = _number(match.group(1))
    elif match := _ERROR_SUMMARY.match(body):
        out.summary_errors = _number(match.group(1))
    elif match := _RACECHECK_SUMMARY.match(body):
        out.summary_errors = _number(match.group(1)) + _number(match.group(2))
    elif body.startswith(NOT_RECORDS):
        if not body.startswith("COMPUTE-SANITIZER"):
            out.notes.append(body)
    else:
        record = Record(_HAZARD_COUNT.sub("", body), case=out.last_case)
        out.records.append(record)
        return record
    return None


def _detail(record: Record, detail: str) -> None:
    if detail.startswith("at ") and record.location is None:
        record.location = detail[3:]
    elif detail.startswith("and ") and " access at " in detail:
        # racecheck: the other side of the race belongs to the message; its hazard count does not,
        # so that records of one race group together
        record.message += " " + _HAZARD_COUNT.sub("", detail)
    elif not detail.startswith(_BACKTRACE) and len(record.details) < 6:
        record.details.append(detail)
