"""RMSNorm's split backward with one row range per column chunk (dW stored by that range's only
program, no partial rows) against the launch table's setting, at the widest rows (GPU).

    python scripts/rms_norm_one_range_ab.py                    # 32768 and 65536 columns, 2^26 bf16 elements

For each width, variant and setting: the backward's do_bench median, its row ranges, the memory it
takes beyond what it was handed (its peak minus what was allocated before the call), and how far its
dW is from the table's, in units of the table's dW magnitude (the sums are ordered differently).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _candidates(width: int, slots: int):
    from kernels._rms_norm_configs import Config

    for chunk, rows, warps in itertools.product((128, 256, 512), (8, 16, 32), (2, 4, 8)):
        if width // chunk >= slots and rows * chunk <= 8192:  # enough chunks for one row range each
            yield Config("split", warps, rows=rows, chunk=chunk, programs_per_sm=1, stages=3)


def main() -> None:
    import torch
    import triton.testing

    from kernels._launch import device_index, program_slots
    from kernels._rms_norm_configs import lookup
    from oracle.bench import peak_mb
    from rms_norm_fixup_ab import backward_inputs  # this script's folder is on sys.path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="32768,65536")
    parser.add_argument("--elements", type=int, default=1 << 26)
    args = parser.parse_args()
    rms = importlib.import_module("kernels.rms_norm")
    slots = program_slots(device_index(torch.empty(0, device="cuda")))
    print(f"{'width':>6} {'variant':7} {'setting':38} {'ranges':>6} {'ms':>8} {'x table':>7} {'KiB':>7} dW off")
    for width in (int(w) for w in args.widths.split(",")):
        for gemma in (False, True):
            X, W, dY, inv_var, dX = backward_inputs(rms, width, args.elements, gemma)
            n_rows = X.shape[0]
            table = lookup("backward", width, n_rows, slots, gemma)
            base_ms = reference = None
            for config in [table, *_candidates(width, slots)]:
                call = lambda config=config: rms.backward(dY, X, W, inv_var, gemma, dX, True, config)  # noqa: E731
                try:
                    kib = peak_mb(call) * 1024
                    ms = triton.testing.do_bench(call, warmup=10, rep=60)
                except Exception as exc:  # noqa: BLE001 - a setting that cannot run is printed, not fatal
                    print(f"{width:>6} {'gemma' if gemma else 'llama':7} {config}: {type(exc).__name__} {exc}"[:200])
                    continue
                dW = call().float()
                chunks = -(-width // config.chunk)
                ranges = -(-n_rows // rms._rows_per_program(n_rows, chunks, config, slots, True))
                if reference is None:
                    base_ms, reference = ms, dW
                off = ((dW - reference).abs().max() / reference.abs().max()).item()
                setting = f"{config.path} w{config.warps} r{config.rows} c{config.chunk} p{config.programs_per_sm}"
                print(f"{width:>6} {'gemma' if gemma else 'llama':7} {setting:38} {ranges:>6} {ms:8.4f} "
                      f"{ms / base_ms:7.3f} {kib:7.1f} {off:.1e}", flush=True)


if __name__ == "__main__":
    main()
