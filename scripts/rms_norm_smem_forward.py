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
forward at chunks up to 8192 columns, 0.0931 against 0.0903 ms (Llama) and 0.0953 against 0.0845
(Gemma) at the best of them. On the H100 (seventeenth session) 16384-column chunks at 16 warps
took 0.1016 ms (Llama) and 0.1022 (Gemma) against the shipped 0.1292 and 0.1135, L2 flushed before
each call; not kept, the overlapped path (kernels/rms_norm.py) gets as far in plain Triton.

The second kernel (``_halves_forward``; on the H100 at best 0.1040 ms, Llama) needs no asynchronous copy: a row's first
columns stay in registers and the rest in shared memory, little enough of each for two programs an
SM (8192 columns held: 112 KiB of shared memory, 59-115 registers by setting under Triton 3.6), so
that one program's loads are in flight while the other reduces and stores, as the shipped kernels'
many programs an SM do at narrower rows.

Gluon does not run under Triton's interpreter, so on a CPU this script only compiles the kernels for
sm_90 (``--compile``: registers, shared memory, barriers, programs an SM); on the GPU it times every
setting against the shipped forward, both variants, with the largest difference from the shipped Y
and 1/rms.

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
import sys
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


@gluon.jit
def _fill(piece, x_row, START: gl.constexpr, SIZE: gl.constexpr, CHUNK: gl.constexpr, layout: gl.constexpr):
    """Columns START to START + SIZE of a row into shared memory, chunk by chunk through registers;
    their squares, summed per lane."""
    offs = gl.arange(0, CHUNK, layout=layout)
    squares = gl.zeros([CHUNK], gl.float32, layout)
    if SIZE > 0:
        for c in gl.static_range(SIZE // CHUNK):
            x = gl.load(x_row + START + c * CHUNK + offs)
            piece.slice(c * CHUNK, CHUNK).store(x)
            x = x.to(gl.float32)
            squares += x * x
    return squares


@gluon.jit
def _drain(piece, y_row, W_ptr, inv_var, START: gl.constexpr, SIZE: gl.constexpr, CHUNK: gl.constexpr,
           layout: gl.constexpr, GEMMA: gl.constexpr):
    """Y of the columns a piece of shared memory holds."""
    offs = gl.arange(0, CHUNK, layout=layout)
    if SIZE > 0:
        for c in gl.static_range(SIZE // CHUNK):
            x = piece.slice(c * CHUNK, CHUNK).load(layout).to(gl.float32)
            w = gl.load(W_ptr + START + c * CHUNK + offs).to(gl.float32)
            gl.store(y_row + START + c * CHUNK + offs, _scaled(x * inv_var, w, y_row.dtype.element_ty, GEMMA))


@gluon.jit
def _scaled(normed, w, dtype: gl.constexpr, GEMMA: gl.constexpr):
    if GEMMA:
        return (normed * (1.0 + w)).to(dtype)
    return (normed.to(dtype).to(gl.float32) * w).to(dtype)


@gluon.jit
def _halves_forward(Y_ptr, X_ptr, W_ptr, inv_var_ptr, n_rows, eps, N: gl.constexpr, HELD: gl.constexpr,
                    P1: gl.constexpr, P2: gl.constexpr, P3: gl.constexpr, CHUNK: gl.constexpr, WARPS: gl.constexpr,
                    GEMMA: gl.constexpr):
    """RMSNorm of contiguous (n_rows, N) rows, each row's first HELD columns kept in registers and the
    rest in shared memory (pieces of P1, P2 and P3 columns: shared memory comes in powers of 2), small
    enough together for two programs an SM: while one reduces and stores its row, the other's loads
    are in flight. No asynchronous copies: a chunk goes from its load to shared memory through
    registers. X is read from HBM once."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    dtype: gl.constexpr = X_ptr.dtype.element_ty
    smallest: gl.constexpr = VEC * 32 * WARPS  # an absent piece (size 0) still gets a buffer to name
    piece1 = gl.allocate_shared_memory(dtype, [P1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    piece2 = gl.allocate_shared_memory(dtype, [P2 if P2 > 0 else smallest], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    piece3 = gl.allocate_shared_memory(dtype, [P3 if P3 > 0 else smallest], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    held_cols = gl.arange(0, HELD, layout=layout)
    for row in range(gl.program_id(0), n_rows, gl.num_programs(0)):
        x_row = X_ptr + row.to(gl.int64) * N
        y_row = Y_ptr + row.to(gl.int64) * N
        held = gl.load(x_row + held_cols).to(gl.float32)
        squares = _fill(piece1, x_row, HELD, P1, CHUNK, layout)
        squares += _fill(piece2, x_row, HELD + P1, P2, CHUNK, layout)
        squares += _fill(piece3, x_row, HELD + P1 + P2, P3, CHUNK, layout)
        inv_var = gl.rsqrt((gl.sum(held * held, axis=0) + gl.sum(squares, axis=0)) / N + eps)
        gl.store(inv_var_ptr + row, inv_var)
        w = gl.load(W_ptr + held_cols).to(gl.float32)
        gl.store(y_row + held_cols, _scaled(held * inv_var, w, dtype, GEMMA))
        _drain(piece1, y_row, W_ptr, inv_var, HELD, P1, CHUNK, layout, GEMMA)
        _drain(piece2, y_row, W_ptr, inv_var, HELD + P1, P2, CHUNK, layout, GEMMA)
        _drain(piece3, y_row, W_ptr, inv_var, HELD + P1 + P2, P3, CHUNK, layout, GEMMA)


def pieces(cols: int, held: int) -> tuple[int, int, int]:
    """The columns after the held ones as up to three powers of 2, largest first (0: no piece)."""
    rest, out = cols - held, []
    for bit in reversed(range(rest.bit_length())):
        if rest >> bit & 1:
            out.append(1 << bit)
    if len(out) > 3:
        raise ValueError(f"{rest} columns after {held} held need more than three pieces of shared memory")
    return tuple(out + [0] * (3 - len(out)))


HALVES = [(held, chunk, warps) for held, chunk, warps in itertools.product((8192, 16384), (2048, 4096), (8, 16))
          if chunk >= VEC * 32 * warps]


def programs_per_sm(n_regs: int, shared: int, warps: int) -> int:
    """How many programs of this kernel an sm_90 SM holds: 2048 threads, 64K registers, 228 KiB of
    shared memory (1 KiB of it reserved a program)."""
    threads = 32 * warps
    return max(0, min(2048 // threads, 65536 // max(1, n_regs * threads), (228 * 1024) // (shared + 1024)))


# Fewer, larger chunks wait and synchronise fewer times a row (16384 and 32768 columns: 4 and 2 a row
# at 65536), at the cost of a coarser overlap with the next row's loads.
SETTINGS = [(chunk, warps) for chunk, warps in itertools.product((2048, 4096, 8192, 16384, 32768), (8, 16, 32))
            if chunk >= VEC * 32 * warps]


def compile_only(cols: int) -> None:
    """Compile every setting of both kernels for sm_90 (no GPU needed): registers, stack, shared
    memory, the copies, waits and barriers in its PTX, and the programs an SM holds."""
    for (chunk, warps), gemma in itertools.product(SETTINGS, (False, True)):
        _report(f"row in shared memory, chunk {chunk:5d} warps {warps:2d} gemma {gemma!s:5}", _smem_forward,
                {"N": cols, "CHUNK": chunk, "WARPS": warps, "GEMMA": gemma}, warps)
    for (held, chunk, warps), gemma in itertools.product(HALVES, (False, True)):
        p1, p2, p3 = pieces(cols, held)
        _report(f"halves, {held:5d} held, chunk {chunk:5d} warps {warps:2d} gemma {gemma!s:5}", _halves_forward,
                {"N": cols, "HELD": held, "P1": p1, "P2": p2, "P3": p3, "CHUNK": chunk, "WARPS": warps,
                 "GEMMA": gemma}, warps)


def _report(label: str, kernel, constexprs: dict, warps: int) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from scripts.rms_norm_registers import _cuobjdump

    signature = {"Y_ptr": "*bf16", "X_ptr": "*bf16", "W_ptr": "*bf16", "inv_var_ptr": "*fp32", "n_rows": "i32",
                 "eps": "fp32"} | {name: "constexpr" for name in constexprs}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    source = GluonASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptx = compiled.asm["ptx"]
    usage = {key: int(value) for key, value in
             re.findall(r"(REG|STACK):(\d+)", _cuobjdump(compiled.asm["cubin"], "--dump-resource-usage"))}
    shared = compiled.metadata.shared
    print(f"{label}: {usage['REG']} registers, {usage['STACK']} B stack, {shared} B shared, "
          f"{programs_per_sm(usage['REG'], shared, warps)} an SM; {ptx.count('cp.async.cg')} cp.async, "
          f"{ptx.count('cp.async.wait_group')} wait_group, {ptx.count('bar.sync')} bar.sync")


def time_on_gpu(cols: int, elements: int, settings: list[tuple[int, int]], variants: list[str],
                halves: list[tuple[int, int, int]]) -> None:
    """Each setting of both kernels against the shipped forward: GPU time, fraction of copy, distance
    from its output."""
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
        launches = {}
        for chunk, warps in settings:
            launches[f"row in shared memory, chunk {chunk:5d} warps {warps:2d}"] = (
                _smem_forward, 1, dict(N=cols, CHUNK=chunk, WARPS=warps, GEMMA=gemma, num_warps=warps))
        for held, chunk, warps in halves:
            p1, p2, p3 = pieces(cols, held)
            launches[f"halves, {held:5d} held, chunk {chunk:5d} warps {warps:2d}"] = (
                _halves_forward, None, dict(N=cols, HELD=held, P1=p1, P2=p2, P3=p3, CHUNK=chunk, WARPS=warps,
                                            GEMMA=gemma, num_warps=warps))
        for label, (kernel, per_sm, options) in launches.items():
            Y = torch.empty_like(X)
            inv_var = torch.empty(rows, device="cuda")
            try:
                if per_sm is None:  # as many programs an SM as its registers and shared memory allow
                    compiled = kernel[(sms,)](Y, X, W, inv_var, rows, 1e-6, **options)
                    per_sm = programs_per_sm(compiled.n_regs, compiled.metadata.shared, options["WARPS"])
                grid = (min(rows, max(1, per_sm) * sms),)

                def call(kernel=kernel, grid=grid, options=options, Y=Y, inv_var=inv_var):
                    kernel[grid](Y, X, W, inv_var, rows, 1e-6, **options)
                ms = _graph_ms(call)
            except Exception as exc:  # noqa: BLE001 - a setting that does not compile or launch is a finding
                print(f"  {label}: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            dy = (Y.float() - shipped_Y.float()).abs().max().item()
            same = (Y == shipped_Y).float().mean().item()
            dinv = (inv_var - shipped_inv).abs().max().item()
            print(f"  {label}, {per_sm} an SM: {ms:.4f} ms, {n_bytes / ms / 1e9 / copy:.1%} of copy, "
                  f"{shipped / ms:.3f}x the shipped speed; max |Y - shipped| {dy:.3g} ({same:.2%} equal), "
                  f"max |1/rms - shipped| {dinv:.3g}", flush=True)


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
        time_on_gpu(args.cols, args.elements, settings, variants, [] if args.only else HALVES)


if __name__ == "__main__":
    main()
