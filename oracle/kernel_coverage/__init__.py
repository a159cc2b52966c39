"""Kernel coverage: which lines of each Triton kernel ran (under the CPU interpreter), which constexpr
specialisations launched, which autotune configs were judged; per op, merged over processes
(docs/design.md §9)."""

from oracle.kernel_coverage.collect import OUTSIDE, RECORDER, Recorder, capture, case_hook, install
from oracle.kernel_coverage.source import KernelSource, kernel_source
from oracle.kernel_coverage.summary import for_report, merge, op_lines, ranges, summary_lines, unreached

__all__ = ["OUTSIDE", "RECORDER", "KernelSource", "Recorder", "capture", "case_hook", "install", "kernel_source",
           "for_report", "merge", "op_lines", "ranges", "summary_lines", "unreached"]
