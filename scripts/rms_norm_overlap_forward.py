"""RMSNorm's forward at 65536 columns: the overlapped path against the looped one, setting by setting (GPU).

The looped forward (kernels/rms_norm.py) sweeps each row twice, the second time from L2, and while a
program is in its second sweep it asks HBM for nothing: 77-81% of copy bandwidth on the H100 and the
H200. The overlapped path (Note [Two rows a step]) loads chunk c of a program's next row beside chunk
c of its current row, so its HBM loads never pause between rows. At the same chunk and warps both
give the same bits (checked before timing here, and in tests/test_kernel_paths.py).

Timed as the benchmark times the forward (CUDA graphs replayed back to back, in turns: oracle.bench.
interleaved_graph_ms), 1024 x 65536 bf16, both variants, the launch table's own setting beside them.

    python scripts/rms_norm_overlap_forward.py            # on the GPU machine
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels._rms_norm_configs import Config  # noqa: E402

rms = importlib.import_module("kernels.rms_norm")  # the module (the package's rms_norm is the function)

SETTINGS = [  # (columns a chunk, warps, programs an SM)
    (4096, 16, 1), (4096, 16, 2), (4096, 32, 1), (4096, 32, 2),
    (8192, 16, 1), (8192, 16, 2), (8192, 32, 1), (8192, 32, 2), (16384, 32, 1), (16384, 32, 2), (32768, 32, 1),
]


def forced(X, W, gemma: bool, path: str, chunk: int, warps: int, per_sm: int):
    """(Y, inv_var) through the kernels' ``path`` at this setting."""
    return rms.forward(X, W, 1e-6, gemma, Config(path, warps, chunk=chunk, programs_per_sm=per_sm))


def time_on_gpu(cols: int, elements: int) -> None:
    import torch
    import triton

    from oracle import bench

    rows = elements // cols
    X = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    W = (1 + 0.1 * torch.randn(cols, device="cuda")).to(torch.bfloat16)
    copy = bench.copy_bandwidth_tbps()
    n_bytes = 2 * X.numel() * X.element_size()
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}: {rows} x {cols} bf16, copy {copy:.2f} TB/s",
          flush=True)
    for gemma in (False, True):
        fns = {"the table's setting": lambda gemma=gemma: rms.forward(X, W, 1e-6, gemma)}
        for setting in SETTINGS:
            overlapped, looped = (forced(X, W, gemma, path, *setting) for path in ("overlapped", "looped"))
            if not all(torch.equal(a, b) for a, b in zip(overlapped, looped)):
                raise SystemExit(f"{setting}: the overlapped path's bits differ from the looped path's")
            for path in ("overlapped", "looped"):
                fns[f"{path:10s} chunk {setting[0]:5d} warps {setting[1]:2d} {setting[2]} an SM"] = (
                    lambda setting=setting, gemma=gemma, path=path: forced(X, W, gemma, path, *setting))
        times = bench.interleaved_graph_ms(fns)
        width = max(len(name) for name in times)
        for name, ms in times.items():
            variant = "gemma" if gemma else "llama"
            print(f"{variant} {name:{width}s} {ms:.4f} ms, {n_bytes / ms / 1e9 / copy:.1%} of copy", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cols", type=int, default=65536)
    parser.add_argument("--elements", type=int, default=2**26)
    args = parser.parse_args()
    time_on_gpu(args.cols, args.elements)


if __name__ == "__main__":
    main()
