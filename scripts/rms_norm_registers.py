"""Registers and spills of RMSNorm's whole-row kernels, compiled for sm_90 on any machine (no GPU).

    python scripts/rms_norm_registers.py [--pass backward] [--cols 16384] [--rows 4096] [--warps 8,16,32]
    python scripts/rms_norm_registers.py --pass forward --cols 65536 --rows 1024 --warps 16,32
    python scripts/rms_norm_registers.py --pass parts --cols 65536 --rows 1024 --chunk 8192 --warps 4,8,16
    python scripts/rms_norm_registers.py --cols 256 --rows 262144 --step-rows 32 --stages 3 --warps 16

Each setting is compiled with the specialisation a contiguous (rows, cols) bf16 launch gets (integer
arguments equal to 1 become constants, multiples of 16 carry their divisibility), then
``cuobjdump`` (shipped in Triton's wheel) reads the cubin: registers per thread, the stack (spill
space), and the instructions with their spill loads (LDL) and stores (STL): in the backward those of
its loop over a program's rows (each row pays them), in the forward (a row per program) the whole
kernel's; and the 64-bit integer divisions in its PTX (the row addresses', where a layout needs
them). Numbers depend on the Triton version: the H200's (3.6) and CI's (3.9) differ; say which.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU even on a CPU machine
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default today, said aloud (3.9 warns)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import torch  # noqa: E402

from kernels import _layout  # noqa: E402

rms_norm = importlib.import_module("kernels.rms_norm")  # the module (kernels.rms_norm is also the function)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
FP32_POINTERS = ("inv_var_ptr", "mean_ptr", "dW_partial_ptr")


def _launch_arguments(rows: int, cols: int) -> dict[str, int]:
    """The integer arguments of a contiguous launch, its row layout the kernels' own (kernels/_layout.py)."""
    layout, _ = _layout.rows_addressable(torch.empty(rows, cols, device="meta"))
    (s0, s1, s2, col_stride), (_, L1, L2) = layout.strides[0], layout.lead
    strides = {}
    for tensor in ("dX", "dY", "X"):
        strides |= {f"{tensor}_s0": s0, f"{tensor}_s1": s1, f"{tensor}_s2": s2, f"{tensor}_col_stride": col_stride}
    programs = min(rows, 132)  # one per SM of an H200
    return strides | {"W_col_stride": 1, "n_rows": rows, "n_cols": cols, "L1": L1, "L2": L2,
                      "rows_per_program": -(-rows // programs), "reserved": 2}


def compile_whole_row(pass_name: str, rows: int, cols: int, warps: int, gemma: bool, chunk: int = 0,
                      step_rows: int = 1, stages: int = 1):
    """The "rows" path of ``pass_name`` for ``step_rows`` rows a program (forward) or a step (backward,
    its loads pipelined ``stages`` deep); for "parts", the forward whose programs share a row, ``chunk``
    columns each (Note [A row shared by programs])."""
    constexprs = dict(GEMMA=gemma, COMPUTE=tl.float32, ROWS=step_rows, BLOCK_SIZE=triton.next_power_of_2(cols))
    if pass_name == "forward":
        kernel = rms_norm._rms_norm_forward_kernel
    elif pass_name == "parts":
        kernel = rms_norm._rms_norm_forward_parts_kernel
        parts = -(-cols // chunk)
        constexprs = dict(GEMMA=gemma, COMPUTE=tl.float32, PARTS=parts, LANES=triton.next_power_of_2(parts),
                          CHUNK=chunk, PATIENCE=rms_norm.PATIENCE)
    else:
        kernel = rms_norm._rms_norm_backward_kernel
        constexprs |= dict(FIXUP=False, DW=True, SPLIT=False, NUM_STAGES=stages)
    values = _launch_arguments(rows, cols)
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.startswith("eps"):
            signature[name] = "fp32"
        elif name == "words_ptr":
            signature[name] = "*i32"
        elif name.endswith("_ptr"):
            signature[name] = "*fp32" if name in FP32_POINTERS else "*bf16"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif values[name] == 1:
            signature[name], constexprs[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if values[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(CUOBJDUMP), *flags, str(path)], capture_output=True, text=True, check=True).stdout


def _instructions(sass: str) -> list[tuple[int, str]]:
    found = (re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in sass.splitlines())
    return [(int(m.group(1), 16), m.group(2).strip()) for m in found if m]


def row_loop(sass: str) -> list[str]:
    """The instructions of the longest backward branch's body (the loop over the program's rows), or
    all of them where there is no loop."""
    instructions, best = _instructions(sass), []
    for address, text in instructions:
        target = re.search(r"BRA (0x[0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            body = [t for a, t in instructions if int(target.group(1), 16) <= a <= address]
            best = max(best, body, key=len)
    return best or [text for _, text in instructions]


def measure(pass_name: str, rows: int, cols: int, warps: int, gemma: bool, chunk: int = 0, step_rows: int = 1,
            stages: int = 1) -> dict:
    compiled = compile_whole_row(pass_name, rows, cols, warps, gemma, chunk, step_rows, stages)
    cubin = compiled.asm["cubin"]
    usage = _cuobjdump(cubin, "--dump-resource-usage")
    loop = row_loop(_cuobjdump(cubin, "-sass"))
    count = lambda opcode: sum(1 for text in loop if re.search(rf"(^|\s){opcode}(\.\S+)?\s", text + " "))  # noqa: E731
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "loop": len(loop), "spill_loads": count("LDL"), "spill_stores": count("STL"),
            "divisions": len(re.findall(r"\b(?:div|rem)\.[su]64\b", compiled.asm["ptx"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pass", dest="pass_name", choices=("forward", "backward", "parts"), default="backward")
    parser.add_argument("--chunk", type=int, default=16384, help="columns per program (--pass parts)")
    parser.add_argument("--cols", type=int, default=16384)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--warps", default="8,16,32", help="comma-separated warp counts")
    parser.add_argument("--step-rows", type=int, default=1, help="rows a program (forward) or a loop step (backward)")
    parser.add_argument("--stages", type=int, default=1, help="the backward's pipelining depth")
    args = parser.parse_args()
    where = "  kernel" if args.pass_name == "forward" else "row loop"
    path = f"parts path, {args.chunk} columns a program" if args.pass_name == "parts" else \
        f"{args.pass_name}'s whole-row path"
    print(f"triton {triton.__version__}, sm_90: the {path}, {args.rows} x {args.cols} bf16, {args.step_rows} rows "
          f"a {'program' if args.pass_name == 'forward' else 'step'}" +
          (f", {args.stages} stages" if args.pass_name == "backward" else ""))
    print(f"variant  warps  registers  stack  {where}: instructions  spill loads  spill stores  64-bit divisions")
    for gemma in (False, True):
        for warps in map(int, args.warps.split(",")):
            m = measure(args.pass_name, args.rows, args.cols, warps, gemma, args.chunk, args.step_rows, args.stages)
            print(f"{'gemma' if gemma else 'llama':7s}  {warps:5d}  {m['registers']:9d}  {m['stack']:5d}  "
                  f"{m['loop']:22d}  {m['spill_loads']:11d}  {m['spill_stores']:12d}  {m['divisions']:16d}", flush=True)


if __name__ == "__main__":
    main()
