"""Rotary position embedding (plain and packed positions): HF's maths, its declaration, its bad inputs
and its benchmark.

Everything the harness knows about this op is here (docs/design.md §6); its hand-written noise model
is rope_noise.py.
"""

from __future__ import annotations

import math

import torch

from oracle import Choice, Dim, DtypeChoice, ErrorInput, Op, PerVariant, Positions, Tensor
from oracle.bench.workload import Bench, checkout_kernels, Peers, Workload, compiled, instantiate, randn_cuda, vendor_peers
from oracle.declare.reference import mirrors
from oracle.declare.spec import layout_bshd
from oracle.ops.rope_noise import NOISE

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


# --- the tensors: rotary tables computed as HF does, packed positions ----------------------------


_ROPE_SCALING = {"default": {}, "linear": {"factor": 4.0},
                 "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 16}}

PACKED = Positions(whole_first_row="first_row")


def packed_positions(batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """Per row, positions restarting at 0 at random segment boundaries, different in every row."""
    return PACKED.make((batch, seq), {}, gen)


def _table(which: int):
    """The cos (0) or sin (1) table of a case's theta and rope_type, as HF computes it. In the
    table's dtype: the model's, or float32, which stays float32 in float64 cases too (gradcheck
    differentiates Q and K; the table is a model's constant)."""
    def make(shape, dtype, gen, device, params):
        max_pos, head_dim = shape
        table_dtype = dtype if params.get("table") == "model" else torch.float32
        rope_type = params.get("rope_type", "default")
        tables = rotary_table(max_pos, head_dim, params.get("theta", 10000.0), rope_type, dtype=table_dtype,
                              **_ROPE_SCALING[rope_type])
        return tables[which].to(device)

    return make


# --- the report's grids ---------------------------------------------------------------------------


def _bshd(batch, heads, kv_heads, seq, head_dim, max_pos) -> dict:
    return {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq": seq, "head_dim": head_dim, "max_pos": max_pos}


def _sweep(full: bool) -> tuple[dict, ...]:
    """GQA ratios, head counts off the head group, head_dim 80 (transposed), 96 and 128; a Llama 3.1
    table in the model's dtype at an odd offset with outliers; a long sequence of small heads, with a
    gradient in HF's (batch, seq, heads, head_dim) storage."""
    shapes = [(1, 4, 4, 8, 64), (2, 6, 2, 5, 80), (1, 5, 1, 6, 96), (2, 32, 8, 16, 128)] if not full else \
        [(1, 4, 4, 64, 64), (2, 6, 2, 128, 80), (1, 5, 1, 256, 96), (4, 32, 8, 512, 128), (2, 12, 3, 300, 256)]
    long = 2100 if full else 300
    points = [{"dims": _bshd(batch, heads, kv, seq, hd, seq + 16), "layout": "transposed" if hd == 80 else "contiguous"}
              for batch, heads, kv, seq, hd in shapes]
    points.append({"dims": _bshd(2, 8, 2, 4, 128, 64), "layout": "offset", "values": "outliers",
                   "params": {"theta": 500000.0, "rope_type": "llama3", "table": "model"}})
    points.append({"dims": _bshd(1, 3, 1, long, 8, long + 5), "grad_layout": "transposed"})
    return tuple(points)


def _scale() -> tuple[dict, ...]:
    """128k-token sequences with tables of that length (Llama 3.1's context): Llama-3-8B's heads in
    either storage, and Q past 2^31 elements in 16-bit (about 2^30 in float32: see rms_norm's
    _SCALE_SHAPES). Packed rows come two to a batch, the first one document as long as the table,
    so that positions reach its last row."""
    points = []
    for variant, batch in (("plain", 1), ("packed", 2)):
        params = {"theta": 500000.0} | ({"first_row": "one document"} if variant == "packed" else {})
        for dtypes, widest in ((("float16", "bfloat16"), 136), (("float32",), 56)):
            for heads, kv_heads, layout in ((32, 8, "contiguous"), (32, 8, "transposed"),
                                            (widest // batch, 8 // batch, "contiguous")):
                points.append({"dims": _bshd(batch, heads, kv_heads, 131072, 128, 131072), "layout": layout,
                               "params": params, "dtypes": dtypes, "variants": (variant,)})
    return tuple(points)


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


# --- the declaration ------------------------------------------------------------------------------


ROPE = Op(
    "rope", reference=rope, reordered=rope_reordered, variants=("plain", "packed"), outputs=("Q_out", "K_out"),
    summary="apply_rotary_pos_emb on Q and K, table rows per token (packed sequences); Q, K, dQ, dK",
    inputs={"Q": Tensor("batch", "heads", "seq", "head_dim"), "K": Tensor("batch", "kv_heads", "seq", "head_dim"),
            # the (max_pos, head_dim) tables of HF's rotary embedding, in float32 or the model's dtype
            "cos": Tensor("max_pos", "head_dim", dtype=DtypeChoice("table", float32="float32", model="case"),
                          values=_table(0), layout=False),
            "sin": Tensor("max_pos", "head_dim", dtype=DtypeChoice("table", float32="float32", model="case"),
                          values=_table(1), layout=False),
            # plain: none (each token's position is its index); packed: restarting at document boundaries
            "position_ids": Tensor("batch", "seq", dtype=torch.int64, values=PerVariant(plain=None, packed=PACKED),
                                   layout=False)},
    # grouped-query heads: Q's a multiple of K's; head_dim rotated in halves (80 and 96 off the powers of two);
    # tables at least as long as the sequence. Programs are tokens.
    dims={"batch": Dim(1, 3), "heads": Dim(1, 32, multiple_of="kv_heads"), "kv_heads": Dim(1, 8),
          "seq": Dim(1, 2**17, programs="tokens"),
          "head_dim": Dim(2, 256, multiple=2, special=(2, 6, 8, 10, 16, 64, 80, 96, 128, 256)),
          "max_pos": Dim(1, 2**17, at_least="seq")},
    params={"theta": Choice(10000.0, 500000.0, 1e6, passed=False),
            "rope_type": Choice("default", "linear", "llama3", passed=False)},
    differentiable=("Q", "K"), may_clobber=("Q", "K"), layout_of=layout_bshd,
    value_kinds=("normal", "large", "tiny", "outliers", "nonfinite"),
    sweep=_sweep(False), full_sweep=_sweep(True), scale=_scale(),
    float64_cases=tuple({"variant": variant, "dims": _bshd(2, 3, 1, 3, 6, 8), "layout": "transposed", "seed": 1}
                        for variant in ("plain", "packed")),
    error_inputs=_rope_errors, noise=NOISE,
)

SPECS = (ROPE,)
