"""Rotary position embedding (plain and packed positions): HF's maths, its cases, its noise model,
its spec and its benchmark.

Everything the harness knows about this op is here (docs/design.md §6).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from hypothesis import strategies as st

from oracle import cases as C
from oracle.cases import (FLOAT_DTYPES, GRAD_KINDS, GRAD_LAYOUTS, LAYOUTS, Budget, Case, covering, grad_kinds,
                          grad_layouts, is_long, layouts, long_counts, long_rows, seeds)
from oracle.checks.memory import FUSE_HEADS
from oracle.declare.reference import mirrors
from oracle.declare.spec import (DTYPES, ErrorInput, OpSpec, Programs, fill, generator, layout_bshd, rounding_error, wide)
from oracle.bench.workload import Bench, checkout_kernels, Peers, Workload, compiled, instantiate, randn_cuda, vendor_peers


# --- HF's maths -----------------------------------------------------------------------------------


@mirrors("transformers.modeling_rope_utils (default, 'linear' and 'llama3' rope_type inverse frequencies)")
def rope_inv_freq(head_dim: int, theta: float, rope_type: str = "default", **params) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_scaling) as transformers computes them for ``rope_type``.

    linear: ``factor``. llama3: ``factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``. All three leave attention_scaling at 1.0.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / params["factor"], 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, **params), 1.0
    raise ValueError(f"rope_type must be 'default', 'linear' or 'llama3', got {rope_type!r}")


def _llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    context = original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    long_cutoff = context / low_freq_factor
    short_cutoff = context / high_freq_factor
    scaled = torch.where(wavelen > long_cutoff, inv_freq / factor, inv_freq)
    blend = (context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - blend) * scaled / factor + blend * scaled
    in_band = ~(wavelen < short_cutoff) * ~(wavelen > long_cutoff)
    return torch.where(in_band, blended, scaled)


@mirrors("transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.forward")
def rotary_cos_sin(inv_freq: torch.Tensor, attention_scaling: float, position_ids: torch.Tensor,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (*position_ids.shape, head_dim) for integer positions, fp32 then cast to dtype."""
    freqs = position_ids[..., None].float() * inv_freq.to(device=position_ids.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(dtype), sin.to(dtype)


def rotary_table(max_pos: int, head_dim: int, theta: float = 10000.0, rope_type: str = "default",
                 dtype: torch.dtype = torch.float32, device=None, **params) -> tuple[torch.Tensor, torch.Tensor]:
    """The (max_pos, head_dim) cos and sin tables the contract's ``rope`` takes: rows of HF's rotary output."""
    inv_freq, scaling = rope_inv_freq(head_dim, theta, rope_type, **params)
    return rotary_cos_sin(inv_freq, scaling, torch.arange(max_pos, device=device), dtype)


@mirrors("transformers.models.llama.modeling_llama.rotate_half")
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


@mirrors("transformers.models.llama.modeling_llama.apply_rotary_pos_emb")
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def table_rows(Q, cos, sin, position_ids):
    """Each token's cos and sin rows, cast to Q's dtype: what HF's rotary embedding returns."""
    if position_ids is None:
        position_ids = torch.arange(Q.shape[2], device=Q.device).expand(Q.shape[0], -1)
    return cos[position_ids].to(Q.dtype), sin[position_ids].to(Q.dtype)


def rope(Q, K, cos, sin, position_ids=None, compute=None):
    """The contract's rope: HF's apply_rotary_pos_emb on the table rows of each token, cast to Q's dtype.

    ``compute`` is accepted for symmetry; HF computes RoPE in the model dtype itself.
    """
    c, s = table_rows(Q, cos, sin, position_ids)
    return apply_rotary_pos_emb(Q, K, c, s)


def rope_reordered(Q, K, cos, sin, position_ids=None, compute=torch.float32):
    """Same rotation with one rounding: each output computed in fp32 (or wider) and cast once."""
    c, s = table_rows(Q, cos, sin, position_ids)
    wide = torch.promote_types(compute, Q.dtype)
    c, s = c.to(wide).unsqueeze(1), s.to(wide).unsqueeze(1)
    return tuple((x.to(wide) * c + rotate_half(x.to(wide)) * s).to(x.dtype) for x in (Q, K))


# --- cases ----------------------------------------------------------------------------------------


@st.composite
def rope_cases(draw, budget: Budget, dtypes=FLOAT_DTYPES) -> Case:
    """RoPE cases: GQA ratios, n_heads not a multiple of 4 or 8, head_dim 80/96, packed positions.
    Programs are tokens x groups of heads. In the long regime, sequences past 64, 128 and 256 tokens
    of few, small heads."""
    head_dim = draw(st.sampled_from((2, 8, 16, 64, 80, 96, 128, 6, 10, 256)))
    kv_heads = draw(st.integers(1, 4))
    n_heads = kv_heads * draw(st.sampled_from((1, 2, 3, 4, 5, 8)))
    batch = draw(st.integers(1, 3))
    if draw(is_long()):
        batch, seq = 1, draw(long_counts(budget))
        head_dim = draw(st.sampled_from((2, 8, 16, 6, 10)))
        n_heads = min(n_heads, max(kv_heads, budget.long_elements // (seq * head_dim) // kv_heads * kv_heads))
    else:
        groups = -(-n_heads // 4)
        room = min(budget.programs // (batch * groups), budget.elements // (batch * n_heads * head_dim))
        seq = draw(st.integers(1, max(1, room)))
    variant = draw(st.sampled_from(("plain", "packed")))
    return Case(
        op="rope", variant=variant, dtype=draw(st.sampled_from(dtypes)),
        dims={"batch": batch, "heads": n_heads, "kv_heads": kv_heads, "seq": seq, "head_dim": head_dim,
              "max_pos": seq + draw(st.integers(0, 64))},
        layout=draw(layouts()), values=draw(st.sampled_from(("normal", "large", "tiny", "outliers", "nonfinite"))),
        params={"theta": draw(st.sampled_from((10000.0, 500000.0, 1e6))),
                "rope_type": draw(st.sampled_from(("default", "linear", "llama3"))),
                "table": draw(st.sampled_from(("float32", "model")))},
        seed=draw(seeds()), grad_layout=draw(grad_layouts()), grad_values=draw(grad_kinds()),
    )


def rope_stratified(dtype: str, budget: Budget) -> list[Case]:
    """Every variant, layout, gradient layout, kind of incoming gradient and kind of values; GQA with a
    head count that is not a multiple of the head group; every other case a long sequence (past 64,
    128, 256 tokens)."""
    out = []
    rows = covering(("plain", "packed", "packed", "plain"), LAYOUTS, GRAD_LAYOUTS, GRAD_KINDS,
                    ("normal", "large", "tiny", "outliers", "nonfinite"))
    for i, (variant, layout, grad_layout, grad_values, values) in enumerate(rows):
        if i % 2:
            dims = {"batch": 1, "heads": 3, "kv_heads": 1, "seq": long_rows(i // 2, budget), "head_dim": 8}
        else:
            dims = {"batch": 2, "heads": 6, "kv_heads": 2, "seq": 5, "head_dim": (80, 16, 64)[i // 2 % 3]}
        dims["max_pos"] = dims["seq"] + 9
        out.append(Case("rope", variant, dtype, dims, layout, values,
                        {"theta": 10000.0, "rope_type": ("default", "llama3", "linear")[i % 3],
                         "table": ("float32", "model")[i // 2 % 2]}, seed=1000 + i, grad_layout=grad_layout,
                        grad_values=grad_values))
    return out


# --- arguments, noise model, report grid, bad inputs ----------------------------------------------


_ROPE_SCALING = {"default": {}, "linear": {"factor": 4.0},
                 "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 16}}


def packed_positions(batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """Per row, positions restarting at 0 at random segment boundaries, different in every row."""
    rows = []
    for _ in range(batch):
        n_cuts = int(torch.randint(0, max(1, seq // 2) + 1, (1,), generator=gen))
        cuts = torch.randperm(max(1, seq - 1), generator=gen)[:n_cuts] + 1 if seq > 1 else torch.tensor([], dtype=torch.int64)
        starts = torch.zeros(seq, dtype=torch.int64)
        starts[cuts[cuts < seq]] = 1
        segment = starts.cumsum(0)
        index = torch.arange(seq)
        first_of_segment = torch.zeros(int(segment.max()) + 1, dtype=torch.int64).scatter_reduce(
            0, segment, index, reduce="amin", include_self=False)
        rows.append(index - first_of_segment[segment])
    return torch.stack(rows)


def _rope_args(case: Case, device) -> dict:
    d = case.dims
    dtype = DTYPES[case.dtype]
    Q = fill((d["batch"], d["heads"], d["seq"], d["head_dim"]), dtype, case.values, generator(case, "Q"), device)
    K = fill((d["batch"], d["kv_heads"], d["seq"], d["head_dim"]), dtype, case.values, generator(case, "K"), device)
    table_dtype = dtype if case.params.get("table") == "model" else torch.float32
    rope_type = case.params.get("rope_type", "default")
    cos, sin = rotary_table(d["max_pos"], d["head_dim"], case.params.get("theta", 10000.0), rope_type,
                              dtype=table_dtype, **_ROPE_SCALING[rope_type])
    positions = None
    if case.variant == "packed":
        positions = packed_positions(d["batch"], d["seq"], generator(case, "position_ids"))
        if case.params.get("first_row") == "one document":  # as long as the table: its last row is used
            positions[0] = torch.arange(d["seq"])
        positions = positions.to(device)
    return {"Q": Q, "K": K, "cos": cos.to(device), "sin": sin.to(device), "position_ids": positions}


def _rope_noise(tensor: str, backward: bool) -> Callable[[dict, dict], torch.Tensor]:
    """HF rotates in the model dtype d: the table rows are rounded to d, each of the two products
    x c and rotate_half(x) s is rounded to d, then their sum (the final rounding, ulp(t)). So the
    noise is 2 u_d at the scale of the two products, which is what lets an output that is a small
    difference of two large products differ from the truth by their rounding. Backward is the same
    rotation with -sin applied to the incoming gradient."""
    def noise(args: dict, upstream: dict) -> torch.Tensor:
        Q = args["Q"]
        c, s = table_rows(Q, args["cos"], args["sin"], args["position_ids"])  # in Q's dtype: as HF rounds them
        c, s = wide(c).unsqueeze(1), wide(s).unsqueeze(1)
        d = Q.dtype
        if backward:
            x = wide(upstream[tensor])
            half = x.shape[-1] // 2
            rotated = torch.cat((x[..., half:], x[..., :half]), -1)  # rotate_half's transpose, up to sign
            s = torch.cat((s[..., half:], s[..., :half]), -1)  # the sin each of those elements was scaled by
        else:
            x = wide(args[tensor])
            rotated = rotate_half(x)
        table = x.abs() * rounding_error(c.abs(), d) + rotated.abs() * rounding_error(s.abs(), d)
        return table + rounding_error((x * c).abs(), d) + rounding_error((rotated * s).abs(), d)

    return noise


def _rope_call(fn, a):
    return tuple(fn(a["Q"], a["K"], a["cos"], a["sin"], a["position_ids"]))


def _rope_sweep(full: bool) -> list[Case]:
    shapes = [(1, 4, 4, 8, 64), (2, 6, 2, 5, 80), (1, 5, 1, 6, 96), (2, 32, 8, 16, 128)] if not full else \
        [(1, 4, 4, 64, 64), (2, 6, 2, 128, 80), (1, 5, 1, 256, 96), (4, 32, 8, 512, 128), (2, 12, 3, 300, 256)]
    out = []
    for variant in ("plain", "packed"):
        for dtype in C.FLOAT_DTYPES:
            for batch, heads, kv, seq, hd in shapes:
                layout = "transposed" if hd == 80 else "contiguous"
                out.append(Case("rope", variant, dtype, {"batch": batch, "heads": heads, "kv_heads": kv, "seq": seq,
                                                         "head_dim": hd, "max_pos": seq + 16}, layout, "normal",
                                {"theta": 10000.0, "rope_type": "default", "table": "float32"}, seed=len(out)))
            out.append(Case("rope", variant, dtype, {"batch": 2, "heads": 8, "kv_heads": 2, "seq": 4, "head_dim": 128,
                                                     "max_pos": 64}, "offset", "outliers",
                            {"theta": 500000.0, "rope_type": "llama3", "table": "model"}, seed=len(out)))
            # a long sequence of small heads, with a gradient in HF's (batch, seq, heads, head_dim) storage
            out.append(Case("rope", variant, dtype, {"batch": 1, "heads": 3, "kv_heads": 1, "seq": 2100 if full else 300,
                                                     "head_dim": 8, "max_pos": (2100 if full else 300) + 5},
                            "contiguous", "normal", {"theta": 10000.0, "rope_type": "default", "table": "float32"},
                            seed=len(out), grad_layout="transposed"))
    return out


def _rope_scale() -> list[Case]:
    """128k-token sequences with tables of that length (Llama 3.1's context): Llama-3-8B's heads in
    either storage, and Q past 2^31 elements in 16-bit (about 2^30 in float32: see rms_norm's
    _SCALE_SHAPES). Packed rows come two to a batch, the first one document as long as the table,
    so that positions reach its last row."""
    out = []
    for variant in ("plain", "packed"):
        batch = 1 if variant == "plain" else 2
        for dtype in C.FLOAT_DTYPES:
            widest = (136 if dtype != "float32" else 56) // batch
            for heads, kv_heads, layout in ((32, 8, "contiguous"), (32, 8, "transposed"), (widest, 8 // batch, "contiguous")):
                params = {"theta": 500000.0, "rope_type": "default", "table": "float32"}
                if variant == "packed":
                    params["first_row"] = "one document"
                out.append(Case("rope", variant, dtype, {"batch": batch, "heads": heads, "kv_heads": kv_heads,
                                                         "seq": 131072, "head_dim": 128, "max_pos": 131072},
                                layout, "normal", params, seed=len(out)))
    return out


def _rope_size(case: Case) -> tuple[int, int]:
    d = case.dims
    return d["seq"], d["batch"] * d["heads"] * d["seq"] * d["head_dim"]


def _rope_tokens(args: dict, index: torch.Tensor) -> dict:
    """The tokens ``index`` of every row: their own positions made explicit (without position_ids a
    token's position is its index in the sequence, which the slice would lose)."""
    Q, positions = args["Q"], args["position_ids"]
    if positions is None:
        positions = torch.arange(Q.shape[2], device=Q.device).expand(Q.shape[0], -1)
    index = index.to(Q.device)
    return args | {"Q": Q[:, :, index], "K": args["K"][:, :, index], "position_ids": positions[:, index]}


PROGRAMS = Programs(unit="tokens", size=_rope_size, args=_rope_tokens,
                    tensor=lambda t, index: t[:, :, index.to(t.device)])


def _rope_errors() -> list[ErrorInput]:
    def args(d, q=(1, 4, 3, 8), k=(1, 2, 3, 8), table=(16, 8), q_dtype=torch.float32, k_dtype=None,
             table_dtype=torch.float32, leaf=False, **given):
        gen = torch.Generator().manual_seed(0)

        def make(shape, dtype):
            return torch.randn(shape, generator=gen).to(device=d, dtype=dtype)

        return {"Q": make(q, q_dtype).requires_grad_(leaf), "K": make(k, k_dtype or q_dtype),
                "cos": make(table, table_dtype), "sin": make(table, table_dtype), "position_ids": None} | given

    def positions(d, rows, dtype=torch.int64):
        return torch.tensor(rows, dtype=dtype, device=d)

    def fused(d, q_columns, k_columns, heads=(4, 2)):
        """Q and K as views of one (batch, seq, columns) projection, as a fused QKV layer makes them."""
        base = torch.randn(1, 3, 48, device=d)
        Q = base[..., q_columns].view(1, 3, heads[0], 8).transpose(1, 2)
        K = base[..., k_columns].view(1, 3, heads[1], 8).transpose(1, 2)
        return args(d, Q=Q, K=K)

    def Q_is_K(d):
        a = args(d, q=(1, 2, 3, 8))
        return a | {"K": a["Q"]}

    def cos_inside_Q(d):
        a = args(d)
        return a | {"cos": a["Q"].view(12, 8), "sin": torch.randn(12, 8, device=d)}

    def meta(d):
        return {name: t.to("meta") if isinstance(t, torch.Tensor) else t for name, t in args(d).items()}

    raises = [
        ErrorInput("Q and K dtypes differ", lambda d: args(d, k_dtype=torch.float16), TypeError, "dtypes must match"),
        ErrorInput("integer Q", lambda d: args(d, q_dtype=torch.int64, k_dtype=torch.float32), TypeError, "Q must be"),
        ErrorInput("bool K", lambda d: args(d, k_dtype=torch.bool), TypeError, "K must be"),
        ErrorInput("complex Q", lambda d: args(d, q_dtype=torch.complex64, k_dtype=torch.float32), TypeError,
                   "Q must be"),
        ErrorInput("integer table", lambda d: args(d, table_dtype=torch.int32), TypeError, "cos must be"),
        ErrorInput("Q None", lambda d: args(d, Q=None), TypeError, r"Q must be a torch\.Tensor"),
        ErrorInput("sin a list", lambda d: args(d, sin=[[0.0] * 8] * 16), TypeError, r"sin must be a torch\.Tensor"),
        ErrorInput("n_heads not a multiple of n_kv_heads", lambda d: args(d, q=(1, 5, 3, 8)), ValueError, "multiple"),
        ErrorInput("Q with zero heads", lambda d: args(d, q=(1, 0, 3, 8)), ValueError, "positive multiple"),
        ErrorInput("K with zero heads", lambda d: args(d, k=(1, 0, 3, 8)), ValueError, "multiple"),
        ErrorInput("head_dim mismatch with the table", lambda d: args(d, table=(16, 6)), ValueError, "cos and sin"),
        ErrorInput("K's head_dim differs", lambda d: args(d, k=(1, 2, 3, 6)), ValueError, "must match Q"),
        ErrorInput("K's batch differs", lambda d: args(d, k=(2, 2, 3, 8)), ValueError, "must match Q"),
        ErrorInput("odd head_dim", lambda d: args(d, q=(1, 4, 3, 7), k=(1, 2, 3, 7), table=(16, 7)), ValueError,
                   "even"),
        ErrorInput("3-D Q", lambda d: args(d, q=(4, 3, 8)), ValueError, "Q must be 4-D"),
        ErrorInput("5-D K", lambda d: args(d, k=(1, 1, 2, 3, 8)), ValueError, "K must be 4-D"),
        ErrorInput("1-D tables", lambda d: args(d, table=(16,)), ValueError, "cos and sin"),
        ErrorInput("cos and sin of different lengths", lambda d: args(d, sin=torch.randn(12, 8, device=d)),
                   ValueError, "cos and sin"),
        ErrorInput("seq longer than the table", lambda d: args(d, q=(1, 4, 20, 8), k=(1, 2, 20, 8)), ValueError,
                   "exceeds"),
        ErrorInput("empty table", lambda d: args(d, table=(0, 8)), ValueError, "exceeds"),
        ErrorInput("position beyond the table", lambda d: args(d, position_ids=positions(d, [[0, 1, 16]])),
                   ValueError, "outside the table", in_kernel_on_gpu=True),
        ErrorInput("negative position", lambda d: args(d, position_ids=positions(d, [[0, -1, 2]])),
                   ValueError, "outside the table", in_kernel_on_gpu=True),
        ErrorInput("position beyond the table, int32",
                   lambda d: args(d, position_ids=positions(d, [[0, 99, 2]], torch.int32)), ValueError,
                   "outside the table", in_kernel_on_gpu=True),
        ErrorInput("position_ids of the wrong shape", lambda d: args(d, position_ids=positions(d, [[0, 1, 2]] * 2)),
                   ValueError, r"\(batch, seq\)"),
        ErrorInput("1-D position_ids", lambda d: args(d, position_ids=positions(d, [0, 1, 2])), ValueError,
                   r"\(batch, seq\)"),
        ErrorInput("float position_ids", lambda d: args(d, position_ids=torch.zeros(1, 3, device=d)), TypeError,
                   "int64 or int32"),
        ErrorInput("bool position_ids", lambda d: args(d, position_ids=torch.zeros(1, 3, dtype=torch.bool, device=d)),
                   TypeError, "int64 or int32"),
        ErrorInput("int16 position_ids", lambda d: args(d, position_ids=positions(d, [[0, 1, 2]], torch.int16)),
                   TypeError, "int64 or int32"),
        ErrorInput("uint8 position_ids (torch would take them as a mask)",
                   lambda d: args(d, position_ids=positions(d, [[0, 1, 2]], torch.uint8)), TypeError, "int64 or int32"),
        ErrorInput("position_ids a list", lambda d: args(d, position_ids=[[0, 1, 2]]), TypeError,
                   r"position_ids must be a torch\.Tensor"),
        ErrorInput("leaf Q requiring grad", lambda d: args(d, leaf=True), ValueError, "in place"),
        ErrorInput("table on another device", lambda d: args(d, cos=torch.randn(16, 8, device="meta")), ValueError,
                   "one device"),
        ErrorInput("position_ids on another device",
                   lambda d: args(d, position_ids=torch.zeros(1, 3, dtype=torch.int64, device="meta")), ValueError,
                   "one device"),
        ErrorInput("every tensor on meta", meta, ValueError, "kernels run on"),
        ErrorInput("Q is K", Q_is_K, ValueError, "Q and K share memory"),
        ErrorInput("K a view of Q's first heads", lambda d: (lambda a: a | {"K": a["Q"][:, :2]})(args(d)), ValueError,
                   "Q and K share memory"),
        ErrorInput("K overlapping Q by one head in a fused projection", lambda d: fused(d, slice(0, 32), slice(24, 40)),
                   ValueError, "Q and K share memory"),
        ErrorInput("expanded Q (stride-0 heads)",
                   lambda d: args(d, Q=torch.randn(1, 1, 3, 8, device=d).expand(1, 4, 3, 8)), ValueError,
                   "Q has elements that share memory"),
        ErrorInput("expanded K (stride-0 batch)",
                   lambda d: args(d, q=(2, 4, 3, 8), K=torch.randn(1, 2, 3, 8, device=d).expand(2, 2, 3, 8)),
                   ValueError, "K has elements that share memory"),
        ErrorInput("unfolded Q (overlapping windows)",
                   lambda d: args(d, Q=torch.randn(1, 4, 10, device=d).unfold(2, 8, 1)), ValueError,
                   "Q has elements that share memory"),
        ErrorInput("cos a view of Q's memory", cos_inside_Q, ValueError, "Q and cos share memory"),
    ]
    same_as_hf = [
        ErrorInput.same_as_hf("int32 position_ids",
                              lambda d: args(d, position_ids=positions(d, [[2, 0, 1]], torch.int32))),
        ErrorInput.same_as_hf("(1, seq) position_ids for a batch of 2",
                              lambda d: args(d, q=(2, 4, 3, 8), k=(2, 2, 3, 8),
                                             position_ids=positions(d, [[2, 0, 1]]))),
        ErrorInput.same_as_hf("column-major position_ids",
                              lambda d: args(d, q=(2, 4, 3, 8), k=(2, 2, 3, 8),
                                             position_ids=positions(d, [[0, 2], [4, 6], [8, 10]]).t())),
        ErrorInput.same_as_hf("positions at the table's last row",
                              lambda d: args(d, position_ids=positions(d, [[15, 0, 15]]))),
        ErrorInput.same_as_hf("packed positions restarting", lambda d: args(d, position_ids=positions(d, [[0, 1, 0]]))),
        ErrorInput.same_as_hf("Q and K interleaved views of a fused projection",
                              lambda d: fused(d, slice(0, 32), slice(32, 48))),
        ErrorInput.same_as_hf("Q and K transposed from (batch, seq, heads, head_dim)",
                              lambda d: args(d, Q=torch.randn(1, 3, 4, 8, device=d).transpose(1, 2),
                                             K=torch.randn(1, 3, 2, 8, device=d).transpose(1, 2))),
        ErrorInput.same_as_hf("float64 table with float32 Q", lambda d: args(d, table_dtype=torch.float64)),
        ErrorInput.same_as_hf("cos float32, sin bfloat16",
                              lambda d: args(d, sin=torch.randn(16, 8, device=d).to(torch.bfloat16))),
        ErrorInput.same_as_hf("cos is sin", lambda d: (lambda a: a | {"sin": a["cos"]})(args(d))),
        ErrorInput.same_as_hf("column-strided table", lambda d: args(d, cos=torch.randn(16, 16, device=d)[:, ::2],
                                                                     sin=torch.randn(16, 16, device=d)[:, 1::2])),
        ErrorInput.same_as_hf("column-major table", lambda d: args(d, cos=torch.randn(8, 16, device=d).t(),
                                                                   sin=torch.randn(8, 16, device=d).t())),
        ErrorInput.same_as_hf("float64", lambda d: args(d, q_dtype=torch.float64, table_dtype=torch.float64)),
        ErrorInput.same_as_hf("bfloat16 Q and K with a float32 table", lambda d: args(d, q_dtype=torch.bfloat16)),
        ErrorInput.same_as_hf("zero batch", lambda d: args(d, q=(0, 4, 3, 8), k=(0, 2, 3, 8))),
        ErrorInput.same_as_hf("zero batch with empty position_ids",
                              lambda d: args(d, q=(0, 4, 3, 8), k=(0, 2, 3, 8),
                                             position_ids=torch.zeros(0, 3, dtype=torch.int64, device=d))),
        ErrorInput.same_as_hf("zero seq", lambda d: args(d, q=(1, 4, 0, 8), k=(1, 2, 0, 8))),
        ErrorInput.same_as_hf("NaN and inf in Q",
                              lambda d: args(d, Q=torch.tensor([math.nan, math.inf, -math.inf, 1.0], device=d)
                                             .repeat(24).view(1, 4, 3, 8))),
        ErrorInput.same_as_hf("as many kv heads as heads", lambda d: args(d, k=(1, 4, 3, 8))),
        ErrorInput.same_as_hf("Q and K requiring grad through a clone",
                              lambda d: (lambda a: a | {"Q": a["Q"].requires_grad_().clone(),
                                                        "K": a["K"].requires_grad_().clone()})(args(d))),
    ]
    return raises + same_as_hf


# --- Liger-Kernel, and the benchmark (GPU) --------------------------------------------------------




def _bench_peers(include_liger: bool) -> Peers:
    """The kernels take the table and the positions (the contract); the peers take each token's rows,
    gathered once per model step as HF does, so the gather is not timed against them."""
    kernels = checkout_kernels()

    peers = {"kernels": lambda: kernels.rope, "eager": lambda: apply_rotary_pos_emb,
             "compile": lambda: compiled(apply_rotary_pos_emb)}
    return peers | vendor_peers("rope", include_liger)


def rope_workload(peers: Peers, dtype, packed: bool, batch=4, heads=32, kv_heads=8, seq=4096,
                  head_dim=128) -> Workload:
    Q0 = randn_cuda(batch, heads, seq, head_dim, dtype=dtype, requires_grad=True)
    K0 = randn_cuda(batch, kv_heads, seq, head_dim, dtype=dtype, requires_grad=True)
    cos_table, sin_table = rotary_table(seq, head_dim, 500000.0, device="cuda")
    if packed:
        positions = packed_positions(batch, seq, torch.Generator().manual_seed(0)).cuda()
    else:
        positions = None
    rows = positions if positions is not None else torch.arange(seq, device="cuda").expand(batch, -1)
    cos_rows, sin_rows = cos_table[rows].to(dtype), sin_table[rows].to(dtype)  # HF computes these once per model step
    dQ, dK = torch.randn_like(Q0), torch.randn_like(K0)
    qk_bytes = (Q0.numel() + K0.numel()) * Q0.element_size()
    work = Workload("rope", "packed" if packed else "plain", dtype, fwd_bytes=2 * qk_bytes, fwd_bwd_bytes=4 * qk_bytes,
                    producer=lambda: (Q0.clone(), K0.clone()), producer_bytes=qk_bytes)
    for name, fn in instantiate(peers).items():
        if name == "kernels":
            def call(Q, K, fn=fn):
                return fn(Q, K, cos_table, sin_table, positions)
        else:
            def call(Q, K, fn=fn):
                return fn(Q, K, cos_rows, sin_rows)
        fresh = (Q0.detach().clone(), K0.detach().clone())
        work.forward[name] = lambda call=call, fresh=fresh: call(*fresh)  # kernels: rotates fresh in place, fine

        def fwd_bwd(call=call):
            Q, K = Q0.clone(), K0.clone()
            outs = call(Q, K)
            return torch.autograd.grad(outs, (Q0, K0), (dQ, dK))

        work.forward_backward[name] = fwd_bwd
    return work


BENCH = Bench(peers=_bench_peers, workloads=lambda peers, dtype: [rope_workload(peers, dtype, packed=False),
                                                                 rope_workload(peers, dtype, packed=True)])


# --- the spec -------------------------------------------------------------------------------------


ROPE = OpSpec(
    name="rope", variants=("plain", "packed"),
    summary="apply_rotary_pos_emb on Q and K, table rows per token (packed sequences); Q, K, dQ, dK",
    arg_names=("Q", "K", "cos", "sin", "position_ids"), call=_rope_call, outputs=("Q_out", "K_out"),
    differentiable=("Q", "K"), reference=rope, reference_reordered=rope_reordered, may_clobber=("Q", "K"),
    cases=lambda budget, dtypes=C.FLOAT_DTYPES: rope_cases(budget, dtypes), stratified=rope_stratified,
    make_args=_rope_args, layout_args=("Q", "K"), layout_of=layout_bshd, sweep=_rope_sweep, fusion=FUSE_HEADS,
    scale=_rope_scale, programs=PROGRAMS,
    float64_cases=tuple(Case("rope", variant, "float64", {"batch": 2, "heads": 3, "kv_heads": 1, "seq": 3, "head_dim": 6,
                                                          "max_pos": 8}, "transposed", "normal",
                             {"theta": 10000.0, "rope_type": "default", "table": "float32"}, seed=1)
                        for variant in ("plain", "packed")),
    error_inputs=_rope_errors,
    noise={"Q_out": _rope_noise("Q", False), "K_out": _rope_noise("K", False),
           "dQ": _rope_noise("Q_out", True), "dK": _rope_noise("K_out", True)},
)

SPECS = (ROPE,)
