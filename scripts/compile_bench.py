"""The kernels inside torch.compile graphs against torch.compile alone, on a GPU: one training step
(forward + backward) of a Llama decoder layer at Llama-3-8B's sizes and of two whole small models
(Llama, Gemma 3), each compiled with Inductor as it is (HF's maths) and with the kernels patched in
(custom ops inside the graph), in the default mode and under CUDA-graph capture
(``mode="reduce-overhead"``).

Per step it measures:
- GPU time: the sum of the step's kernel durations (torch.profiler), what the device is busy for;
- wall time: the median host time of a step that ends synchronised, what a training loop sees;
- peak memory: the most allocated during a step, above what was allocated before it.
Both variants run in the same process on the same inputs, and their losses are printed side by side
(they differ in the last bits: Inductor fuses HF's maths its own way, the kernels round as HF does).

    python scripts/compile_bench.py --json out.json           # on the GPU (docs/performance.md)
    python scripts/compile_bench.py --small --steps 2         # a smoke run, CPU too (no capture there)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding  # noqa: E402

from kernels.patching import patch_model  # noqa: E402
from oracle.environment import environment  # noqa: E402

LLAMA_3_8B_LAYER = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0)
SMALL_MODEL = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=128, vocab_size=32000)
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=128)


class DecoderLayerStep(torch.nn.Module):
    """One Llama decoder layer with its rotary tables, as a module: hidden states in, hidden states out."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, hidden, position_ids):
        out = self.layer(hidden, position_embeddings=self.rotary(hidden, position_ids), position_ids=position_ids)
        return out[0] if isinstance(out, tuple) else out


def targets(small: bool, device, dtype):
    """(name, make_model, make_step): a fresh model each time, and the training step on its inputs."""
    batch, seq = (2, 16) if small else (2, 2048)
    torch.manual_seed(0)
    ids = torch.randint(0, (TINY if small else SMALL_MODEL)["vocab_size"], (batch, seq), device=device)
    positions = torch.arange(seq, device=device).expand(batch, seq)

    def layer():
        config = LlamaConfig(**(TINY if small else LLAMA_3_8B_LAYER), attn_implementation="sdpa")
        torch.manual_seed(0)
        return DecoderLayerStep(config).to(device=device, dtype=dtype)

    hidden = torch.randn(batch, seq, (TINY if small else LLAMA_3_8B_LAYER)["hidden_size"], device=device, dtype=dtype)
    upstream = torch.randn_like(hidden)

    def layer_step(model):
        x = hidden.detach().requires_grad_()
        out = model(x, positions)
        loss = (out.float() * upstream.float()).sum()
        loss.backward()
        return loss

    def whole(cls, config_cls, extra):
        def make():
            config = config_cls(**(TINY if small else SMALL_MODEL), **extra, attn_implementation="sdpa")
            torch.manual_seed(0)
            return cls(config).to(device=device, dtype=dtype)
        return make

    def model_step(model):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    return [("llama decoder layer (Llama-3-8B sizes)", layer, layer_step),
            ("llama, 4 layers", whole(LlamaForCausalLM, LlamaConfig, {}), model_step),
            ("gemma 3, 4 layers", whole(Gemma3ForCausalLM, Gemma3TextConfig, {"sliding_window": seq // 2}), model_step)]


def _kernel_time_ms(step, steps: int) -> float | None:
    """The kernels' summed device time per step, from torch.profiler (None on a CPU)."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total_us = sum(e.device_time_total for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    return total_us / 1000 / steps


def measure(make_model, step_fn, patched: bool, mode: str | None, steps: int, device) -> dict:
    model = make_model()
    if patched:
        patch_model(model)
    compiled = torch.compile(model, mode=mode)
    capture = mode == "reduce-overhead" and device.type == "cuda"

    def step():
        if capture:
            torch.compiler.cudagraph_mark_step_begin()
        loss = step_fn(compiled)
        model.zero_grad(set_to_none=True)
        return loss

    started = time.perf_counter()
    for _ in range(3):  # compile, then warm (capture records on the second and third calls)
        loss = step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    compile_s = time.perf_counter() - started
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        walls.append((time.perf_counter() - t0) * 1000)
    peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        sync()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    return {"loss": float(loss.detach()), "wall_ms": statistics.median(walls), "gpu_ms": _kernel_time_ms(step, steps),
            "peak_mib": peak, "compile_s": compile_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes (a smoke run; on a CPU)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement (default 20)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--only", metavar="WORDS", help="only the targets whose name contains this (e.g. gemma)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps takes a positive count")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    modes = [None, "reduce-overhead"] if device.type == "cuda" else [None]
    rows = []
    chosen = [t for t in targets(args.small, device, dtype) if args.only is None or args.only in t[0]]
    if not chosen:
        parser.error(f"--only {args.only!r} names no target")
    for name, make_model, step_fn in chosen:
        for mode in modes:
            result = {}
            for patched in (False, True):
                torch._dynamo.reset()
                result["kernels" if patched else "compile"] = measure(make_model, step_fn, patched, mode, args.steps,
                                                                      device)
            rows.append({"target": name, "mode": mode or "default", **result})
            c, k = result["compile"], result["kernels"]
            gpu = f"gpu {k['gpu_ms']:.3f} / {c['gpu_ms']:.3f} ms ({k['gpu_ms'] / c['gpu_ms']:.2f}x)" if c["gpu_ms"] else ""
            mem = f"peak {k['peak_mib']:.0f} / {c['peak_mib']:.0f} MiB" if c["peak_mib"] is not None else ""
            print(f"{name:40s} {mode or 'default':16s} wall {k['wall_ms']:.3f} / {c['wall_ms']:.3f} ms "
                  f"({k['wall_ms'] / c['wall_ms']:.2f}x)  {gpu}  {mem}  loss {k['loss']:.5f} / {c['loss']:.5f}",
                  flush=True)
    print("(kernels inside the graph / compile alone)")
    if args.json:
        args.json.write_text(json.dumps({"environment": environment(), "dtype": str(dtype), "steps": args.steps,
                                         "results": rows}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
