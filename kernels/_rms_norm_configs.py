"""RMSNorm's launch settings per row width, read from measurements committed beside this module.

``rms_norm_configs.json`` is written by ``scripts/tune_rms_norm.py`` on a GPU: for every power-of-two
width from 128 to 65536 it times each candidate setting of the forward and of the backward at 2^26
elements and keeps the fastest, or within 5% of it the one that holds the least memory (the split
backward's single row range, which needs no partial rows of dW). A width is looked up by its block
(the next power of two); narrower blocks take the 128 entry with proportionally more rows per
program, so a program still handles as many elements as the measured one. The table was measured
on Llama; its ``gemma`` section holds Gemma's own measurements at the widths where its path wanted
another setting, and Gemma takes those.

The paths of each pass:
  forward  "rows":   ROWS whole rows per program, one 2-D block (narrow and medium rows).
           "looped": persistent programs, each a row at a time in CHUNK-wide steps: a first sweep
                     for the row's mean square, a second that re-reads the row (from L2) and writes.
           "overlapped": the looped path with one row's second sweep and the program's next row's
                     first in one loop (rows of one).
           "parts":  persistent programs sharing each row, CHUNK columns each, exchanging their shares
                     of the sum of squares through memory: the row is read once.
  backward "rows":   persistent programs over contiguous row ranges, ROWS whole rows per step; each
                     program sums its dW share in registers.
           "split":  a row's sum(g * normed) first (one small kernel), then a 2-D grid of (row range,
                     CHUNK of columns) programs: a whole row never has to fit one program.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from ._launch import next_power_of_2

CONFIG_FILE = Path(__file__).with_name("rms_norm_configs.json")
SCHEMA = "kernel-oracle/rms-norm-configs/1"
NARROWEST, WIDEST = 128, 65536  # the measured widths
PATHS = {"forward": ("rows", "looped", "overlapped", "parts"), "backward": ("rows", "split")}


@dataclasses.dataclass(frozen=True)
class Config:
    path: str  # see the module docstring
    warps: int
    rows: int = 1  # rows per program ("rows" forward), swept together ("looped") or per loop step (backward)
    chunk: int = 0  # columns per step of the "looped", "overlapped" and "split" paths
    programs_per_sm: int = 1  # persistent programs (forward "looped", "overlapped", backward "rows"); "split": ranges
    stages: int = 1  # loop steps whose loads are in flight at once (fewer where their tiles would not fit)

    @classmethod
    def of(cls, entry: dict, pass_name: str) -> Config:
        config = cls(**entry)
        if config.path not in PATHS[pass_name]:
            raise ValueError(f"{pass_name} path must be one of {PATHS[pass_name]}, got {config.path!r}")
        return config


@functools.cache
def table() -> dict[str, dict[int, Config]]:
    """{"forward"|"backward": {width: chosen Config}} from the committed measurements."""
    data = json.loads(CONFIG_FILE.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{CONFIG_FILE}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    return {variant: {pass_name: {int(width): Config.of(entry["chosen"], pass_name)
                                  for width, entry in section.get(pass_name, {}).items()} for pass_name in PATHS}
            for variant, section in (("llama", data), ("gemma", data.get("gemma", {})))}


def _floor_power_of_2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


@functools.lru_cache(maxsize=4096)  # on every call's path; a model has few shapes
def lookup(pass_name: str, n_cols: int, n_rows: int, slots: int, gemma: bool = False) -> Config:
    """The measured setting for rows of ``n_cols`` (Gemma's where one was measured for it, Llama's
    otherwise); ``slots`` is the program count that fills the device once (SMs). Rows per program
    shrink for short inputs so every slot still gets a program."""
    block = next_power_of_2(n_cols)
    width = min(max(block, NARROWEST), WIDEST)
    measured = table()
    config = measured["gemma" if gemma else "llama"][pass_name].get(width) or measured["llama"][pass_name][width]
    if config.path not in ("rows", "looped"):
        return config
    rows = config.rows * (width // block)  # narrower than measured: the same elements per program
    rows = min(rows, _floor_power_of_2(n_rows // max(slots, 1)))
    return dataclasses.replace(config, rows=max(rows, 1))
