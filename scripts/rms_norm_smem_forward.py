"""An experiment: RMSNorm's forward at 65536 columns with each row held in shared memory (Gluon).

The shipped looped forward reads a 65536-column row twice, the second time mostly from L2, and
runs at 77-81% of copy bandwidth; a row per program in registers (read once) is no faster, because
a program holds one row and its SM waits for each row's loads before it can reduce it. Here one
persistent program per SM keeps its row in shared memory (a bf16 row is 128 KiB of the 227 an SM
lends a program), copied there with asynchronous copies (cp.async), one commit group per chunk.
While it writes row r's Y chunk by chunk, each chunk's shared memory, once read, is refilled with
the same chunk of its next row, so the SM's loads of row r + 1 are in flight while row r is
normalised and stored. Each thread copies exactly the elements it later reads (one layout for the
copy and the load), so a thread needs only its own copies (``wait_group``); Triton 3.6 still puts a
barrier after each wait and before each refill (``--compile`` counts them: 33 in the kernel at 8
chunks a row; Triton 3.9 compiles 18).
Measured on the H200 (docs/performance.md, sixteenth session): slower than the shipped looped
forward, 0.0931 against 0.0903 ms (Llama) and 0.0953 against 0.0845 (Gemma) at its best setting.

Gluon does not run under Triton's interpreter, so on a CPU this script only compiles the kernel for
sm_90 (``--compile``: registers, shared memory, spills); on the GPU it times it against the shipped
forward, both variants, with the largest difference from the shipped Y and 1/rms.

    python scripts/rms_norm_smem_forward.py --compile   # any machine (the GPU's Triton: 3.6)
    python scripts/rms_norm_smem_forward.py             # on the GPU machine
    python scripts/rms_norm_smem_forward.py --only 8192,32 --variants llama   # one setting (under ncu)
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Triton 3.6 (the GPU machine's) names the asynchronous copy async_copy_global_to_shared; later
# versions (CI's 3.9) async_load, with the same arguments.
copy_to_shared = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
VEC = gl.constexpr(8)  # elements a thread copies at once: 16 bytes of bf16, cp.async's widest


@gluon.jit
def _smem_forward(Y_ptr, X_ptr, W_ptr, inv_var_ptr, n_rows, eps,
                  N: gl.constexpr, CHUNK: gl.constexpr, WARPS: gl.constexpr, GEMMA: gl.constexpr):
    """RMSNorm of contiguous (n_rows, N) rows, one persistent program per SM, each row in shared memory."""
    CHUNKS: gl.constexpr = N // CHUNK
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    dtype: gl.constexpr = X_ptr.dtype.element_ty
    row_buffer = gl.allocate_shared_memory(dtype, [N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    offs = gl.arange(0, CHUNK, layout=layout)
    first = gl.program_id(0)
    step = gl.num_programs(0)

    # The first row's chunks, one commit group each, so that chunk c can be awaited alone.
    for c in gl.static_range(CHUNKS):
        copy_to_shared(
            row_buffer.slice(c * CHUNK, CHUNK), X_ptr + first.to(gl.int64) * N + c * CHUNK + offs,
            mask=gl.full([CHUNK], first, gl.int32, layout) < n_rows)
        async_copy.commit_group()

    for row in range(first, n_rows, step):
        squares = gl.zeros([CHUNK], gl.float32, layout)
        for c in gl.static_range(CHUNKS):
            async_copy.wait_group(CHUNKS - 1 - c)  # this row's chunk c has landed (groups complete in order)
            x = row_buffer.slice(c * CHUNK, CHUNK).load(layout).to(gl.float32)
            squares += x * x
        inv_var = gl.rsqrt(gl.sum(squares, axis=0) / N + eps)
        gl.store(inv_var_ptr + row, inv_var)
        following = row + step
        for c in gl.static_range(CHUNKS):
            x = row_buffer.slice(c * CHUNK, CHUNK).load(layout).to(gl.float32)
            w = gl.load(W_ptr + c * CHUNK + offs).to(gl.float32)
            normed = x * inv_var
            if GEMMA:
                y = normed * (1.0 + w)
            else:
                y = normed.to(dtype).to(gl.float32) * w
            gl.store(Y_ptr + row.to(gl.int64) * N + c * CHUNK + offs, y.to(dtype))
            # The chunk is in registers: refill its shared memory with the next row's (an empty group
            # past the last row keeps the count of groups the waits above rely on).
            copy_to_shared(
                row_buffer.slice(c * CHUNK, CHUNK), X_ptr + following.to(gl.int64) * N + c * CHUNK + offs,
                mask=gl.full([CHUNK], following, gl.int32, layout) < n_rows)
            async_copy.commit_group()
    async_copy.wait_group(0)


# Fewer, larger chunks wait and synchronise fewer times a row (16384 and 32768 columns: 4 and 2 a row
# at 65536), at the cost of a coarser overlap with the next row's loads.
SETTINGS = [(chunk, warps) for chunk, warps in itertools.product((2048, 4096, 8192, 16384, 32768), (8, 16, 32))
            if chunk >= VEC * 32 * warps]


def compile_only(cols: int) -> None:
    """Compile every setting for sm_90 (no GPU needed) and print its registers and shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    for (chunk, warps), gemma in itertools.product(SETTINGS, (False, True)):
        signature = {"Y_ptr": "*bf16", "X_ptr": "*bf16", "W_ptr": "*bf16", "inv_var_ptr": "*fp32",
                     "n_rows": "i32", "eps": "fp32", "N": "constexpr", "CHUNK": "constexpr", "WARPS": "constexpr",
                     "GEMMA": "constexpr"}
        constexprs = {"N": cols, "CHUNK": chunk, "WARPS": warps, "GEMMA": gemma}
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
        source = GluonASTSource(_smem_forward, signature, constexprs=constexprs, attrs=attrs)
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        ptx = kernel.asm["ptx"]
        usage = _resource_usage(kernel.asm["cubin"])
        print(f"chunk {chunk:5d} warps {warps:2d} gemma {gemma!s:5}: {usage['REG']} registers, {usage['STACK']} B "
              f"stack, {kernel.metadata.shared} B shared, {ptx.count('cp.async.c')} cp.async, "
              f"{ptx.count('cp.async.wait_group')} wait_group, {ptx.count('bar.sync')} bar.sync")


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers and stack of a cubin, read by the cuobjdump in Triton's wheel."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        out = subprocess.run([str(tool), "--dump-resource-usage", str(path)], capture_output=True, text=True,
                             check=True).stdout
    return {key: int(value) for key, value in re.findall(r"(REG|STACK):(\d+)", out)}


def time_on_gpu(cols: int, elements: int, settings: list[tuple[int, int]], variants: list[str]) -> None:
    """Each setting against the shipped forward: GPU time, fraction of copy, distance from its output."""
    import torch

    from oracle.bench import copy_bandwidth_tbps
    from scripts.rms_norm_l2_hints import _graph_ms

    rms = importlib.import_module("kernels.rms_norm")
    rows = elements // cols
    X = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    W = (1 + 0.1 * torch.randn(cols, device="cuda")).to(torch.bfloat16)
    copy = copy_bandwidth_tbps()
    n_bytes = 2 * X.numel() * X.element_size()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}: {rows} x {cols} bf16, copy {copy:.2f} TB/s")
    for gemma in (variant == "gemma" for variant in variants):
        shipped_Y, shipped_inv = rms.forward(X, W, 1e-6, gemma)
        shipped = _graph_ms(lambda: rms.forward(X, W, 1e-6, gemma))
        variant = "gemma" if gemma else "llama"
        print(f"{variant}: shipped {shipped:.4f} ms, {n_bytes / shipped / 1e9 / copy:.1%} of copy")
        for chunk, warps in settings:
            Y = torch.empty_like(X)
            inv_var = torch.empty(rows, device="cuda")

            def call():
                _smem_forward[(min(rows, sms),)](Y, X, W, inv_var, rows, 1e-6, N=cols, CHUNK=chunk, WARPS=warps,
                                                 GEMMA=gemma, num_warps=warps)
            try:
                ms = _graph_ms(call)
            except Exception as exc:  # noqa: BLE001 - a setting that does not compile or launch is a finding
                print(f"  chunk {chunk} warps {warps}: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            dy = (Y.float() - shipped_Y.float()).abs().max().item()
            same = (Y == shipped_Y).float().mean().item()
            dinv = (inv_var - shipped_inv).abs().max().item()
            print(f"  chunk {chunk:5d} warps {warps:2d}: {ms:.4f} ms, {n_bytes / ms / 1e9 / copy:.1%} of copy, "
                  f"{shipped / ms:.3f}x the shipped speed; max |Y - shipped| {dy:.3g} ({same:.2%} equal), "
                  f"max |1/rms - shipped| {dinv:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="only compile for sm_90 (any machine)")
    parser.add_argument("--cols", type=int, default=65536)
    parser.add_argument("--elements", type=int, default=2**26)
    parser.add_argument("--only", default=None, metavar="CHUNK,WARPS", help="time this setting alone (for ncu)")
    parser.add_argument("--variants", default="llama,gemma")
    args = parser.parse_args()
    if args.compile:
        os.environ["TRITON_INTERPRET"] = "0"
        os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default today, said aloud (3.9 warns)
        compile_only(args.cols)
    else:
        variants = args.variants.split(",")
        if set(variants) - {"llama", "gemma"}:
            parser.error(f"--variants takes llama and gemma, got {args.variants}")
        settings = [tuple(int(v) for v in args.only.split(","))] if args.only else SETTINGS
        time_on_gpu(args.cols, args.elements, settings, variants)


if __name__ == "__main__":
    main()
