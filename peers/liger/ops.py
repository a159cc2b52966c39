"""What Liger-Kernel 0.8.5's Triton kernels compute, declared for the harness.

Each reference is the maths of the model, paper or PyTorch loss the kernel stands in for, written
here in plain torch (no Liger code): where that maths upcasts (HF's losses take float32 logits) the
reference does too, and where it computes in the input's dtype (a module's plain forward) so does
the reference. RMSNorm, RoPE, SwiGLU and GeGLU are the harness's built-in ops (``--impl liger``)
and are not declared again here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oracle import Choice, Dim, Integers, Op, Tensor

ROWS = Dim(1, 4096, programs=True)
WIDTH = Dim(1, 8192, special=(1, 7, 128, 1000, 1023, 4097, 8192))
TOKENS = Dim(1, 1024, special=(1, 3, 64, 257))
VOCAB = Dim(2, 32768, special=(2, 7, 1000, 4097, 32000))
IGNORED = Integers(0, "vocab", {-100: 0.1})  # next-token labels, a tenth of them ignored


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float32, or float64 for float64 inputs: what HF's losses do to logits."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _log_probabilities(shape, dtype, generator, device):
    """Rows of log-probabilities, log_softmax of N(0, 2^2) in float64, rounded once to the dtype."""
    x = 2 * torch.randn(shape, generator=generator, dtype=torch.float64)
    return torch.log_softmax(x, dim=-1).to(dtype=dtype, device=device)


# --- norms --------------------------------------------------------------------------------------------

LAYER_NORM = Op(
    "layer_norm", reference=lambda X, W, B, eps: F.layer_norm(X, X.shape[-1:], W, B, eps),
    inputs={"X": Tensor("rows", "cols"), "W": Tensor("cols", values="weight"), "B": Tensor("cols", values="small")},
    dims={"rows": ROWS, "cols": WIDTH}, params={"eps": Choice(1e-6, 1e-5)}, outputs=("Y",),
    summary="LigerLayerNormFunction: torch.nn.LayerNorm",
)


def add_rms_norm(X, R, W, eps):
    """A decoder layer's residual add, then Llama's RMSNorm (normalised in fp32, rounded, times W)."""
    residual = X + R
    h = _upcast(residual)
    h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    return W * h.to(residual.dtype), residual


FUSED_ADD_RMS_NORM = Op(
    "fused_add_rms_norm", reference=add_rms_norm,
    inputs={"X": Tensor("rows", "cols"), "R": Tensor("rows", "cols"), "W": Tensor("cols", values="weight")},
    dims={"rows": ROWS, "cols": WIDTH}, params={"eps": 1e-6}, outputs=("Y", "residual"),
    may_clobber=("X", "R"),  # in_place=True writes the new residual into them (not the module's default)
    summary="LigerFusedAddRMSNormFunction (casting_mode='llama', in_place=False)",
)

GROUP_SIZE = 4  # channels per group: GroupNorm(num_groups=channels // 4, channels)


def group_norm(X, W, B, eps):
    """torch.nn.GroupNorm over (batch, channels, hidden), four channels to a group."""
    return F.group_norm(X, X.shape[1] // GROUP_SIZE, W, B, eps)


GROUP_NORM = Op(
    "group_norm", reference=group_norm,
    inputs={"X": Tensor("batch", ("groups", GROUP_SIZE), "hidden"), "W": Tensor(("groups", GROUP_SIZE), values="weight"),
            "B": Tensor(("groups", GROUP_SIZE), values="small")},
    dims={"batch": Dim(1, 64, special=(1, 3), programs=True), "groups": Dim(1, 16, special=(1, 2, 3)),
          "hidden": Dim(1, 2048, special=(1, 7, 64, 1000, 1025))},
    params={"eps": 1e-6}, outputs=("Y",),
    summary="LigerGroupNormFunction: torch.nn.GroupNorm, 4 channels per group",
)


def poly_norm(X, W, B, eps):
    """PolyNorm (PolyCom): w0 norm(x^3) + w1 norm(x^2) + w2 norm(x) + b, norm(u) = u / rms(u), in X's dtype."""
    def norm(u):
        return u * torch.rsqrt(u.square().mean(-1, keepdim=True) + eps)

    return W[0] * norm(X * X * X) + W[1] * norm(X * X) + W[2] * norm(X) + B


POLY_NORM = Op(
    "poly_norm", reference=poly_norm,
    inputs={"X": Tensor("rows", "cols"), "W": Tensor(3, values="weight"), "B": Tensor(values="small")},  # 0-d, as LigerPolyNorm's bias
    dims={"rows": ROWS, "cols": WIDTH}, params={"eps": 1e-6}, outputs=("Y",),
    summary="LigerPolyNormFunction (in_place=True: dX written into dY)",
)


def modulated_rms_norm(X, W, scale, shift, eps):
    """A DiT block's adaptive norm: Llama's RMSNorm, then times (1 + scale) plus shift, per element."""
    h = _upcast(X)
    normed = (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)).to(X.dtype) * W
    return normed * (1 + scale) + shift


MODULATED_RMS_NORM = Op(
    "modulated_rms_norm", reference=modulated_rms_norm,
    inputs={"X": Tensor("rows", "cols"), "W": Tensor("cols", values="weight"),
            "scale": Tensor("rows", "cols", values="small"), "shift": Tensor("rows", "cols", values="small")},
    dims={"rows": ROWS, "cols": WIDTH}, params={"eps": 1e-6}, outputs=("Y",),
    summary="LigerModulatedRMSNormFunction (llama casting, per-row scale and shift, in_place=True)",
)


def dyt(x, alpha, gamma, beta):
    """Dynamic Tanh (Zhu et al. 2025), the module's forward: tanh(alpha x) gamma + beta."""
    return torch.tanh(alpha * x) * gamma + beta


DYT = Op(
    "dyt", reference=dyt,
    inputs={"x": Tensor("rows", "cols"), "alpha": Tensor(1, values="positive"), "gamma": Tensor("cols", values="weight"),
            "beta": Tensor("cols", values="small")},
    dims={"rows": ROWS, "cols": WIDTH}, outputs=("y",),
    summary="LigerDyTFunction: DynamicTanh",
)

# --- activations and normalisers --------------------------------------------------------------------------

SOFTMAX = Op(
    "softmax", reference=lambda X: torch.softmax(X, dim=-1),
    inputs={"X": Tensor("rows", "cols")}, dims={"rows": ROWS, "cols": WIDTH}, outputs=("Y",),
    summary="LigerSoftmaxFunction: softmax over the last dim",
)


def sparsemax(X):
    """Sparsemax (Martins & Astudillo 2016) over the last dim: the Euclidean projection onto the
    simplex, max(x - tau, 0), tau from the sorted values' running sums."""
    z, _ = torch.sort(X, dim=-1, descending=True)
    k = torch.arange(1, X.shape[-1] + 1, device=X.device, dtype=X.dtype)
    running = z.cumsum(-1)
    # how many entries stay positive: at least the largest (1 + z_1 > z_1 is exact maths, which a
    # 16-bit 1 + z_1 rounded back to z_1 would deny)
    support = (1 + k * z > running).sum(-1, keepdim=True).clamp(min=1)
    tau = (running.gather(-1, support - 1) - 1) / support.to(X.dtype)
    # relu, not clamp(min=0): where an entry ties tau exactly (common on a 16-bit grid) its y is 0
    # and sparsemax's Jacobian leaves it out of the support (the paper's S = {j: y_j > 0}); clamp's
    # backward passes the gradient at the tie while tau keeps its gradient over the other entries,
    # a mix of the two one-sided derivatives that neither side has
    return torch.relu(X - tau)


SPARSEMAX = Op(
    "sparsemax", reference=sparsemax,
    inputs={"X": Tensor("rows", "cols")}, dims={"rows": ROWS, "cols": Dim(1, 4096, special=(1, 2, 7, 128, 1000, 1025))},
    outputs=("Y",), value_kinds=("normal", "large", "tiny", "outliers"),
    summary="LigerSparsemaxFunction (dim=-1)",
)

RELU_SQUARED = Op(
    "relu_squared", reference=lambda X: torch.relu(X).square(),
    inputs={"X": Tensor("rows", "cols")}, dims={"rows": ROWS, "cols": WIDTH}, outputs=("Y",),
    summary="LigerReLUSquaredFunction: relu(x)^2 (Primer, Nemotron)",
)

# --- losses -----------------------------------------------------------------------------------------------

CROSS_ENTROPY = Op(
    "cross_entropy",
    reference=lambda logits, target: F.cross_entropy(_upcast(logits), target, ignore_index=-100),
    inputs={"logits": Tensor("tokens", "vocab"), "target": Tensor("tokens", dtype=torch.int64, values=IGNORED)},
    dims={"tokens": TOKENS, "vocab": VOCAB}, outputs=("loss",),
    summary="LigerCrossEntropyFunction: HF's loss (float32 logits), mean over the kept tokens",
)


def fused_linear_cross_entropy(X, W, target):
    """An LM head and its loss as HF computes them: logits = X W^T in X's dtype, upcast, cross-entropy."""
    return F.cross_entropy(_upcast(X @ W.T), target, ignore_index=-100)


FUSED_LINEAR_CROSS_ENTROPY = Op(
    "fused_linear_cross_entropy", reference=fused_linear_cross_entropy,
    inputs={"X": Tensor("tokens", "hidden"), "W": Tensor("vocab", "hidden", values="small"),
            "target": Tensor("tokens", dtype=torch.int64, values=IGNORED)},
    dims={"tokens": TOKENS, "hidden": Dim(1, 1024, special=(1, 7, 64, 257)),
          "vocab": Dim(2, 8192, special=(2, 7, 1000, 4097))},
    outputs=("loss",),
    summary="LigerFusedLinearCrossEntropyFunction: lm_head then HF's loss",
)


def kl_div(input, target, reduction):
    """torch.nn.KLDivLoss(log_target=False) on float32 copies: input log-probabilities, target probabilities."""
    return F.kl_div(_upcast(input), _upcast(target), reduction=reduction)


KL_DIV = Op(
    "kl_div", reference=kl_div,
    inputs={"input": Tensor("tokens", "vocab"), "target": Tensor("tokens", "vocab", values="probabilities")},
    dims={"tokens": TOKENS, "vocab": VOCAB}, params={"reduction": Choice("batchmean", "sum", "mean", "none")},
    differentiable=("input",),  # the target is the teacher's: Liger returns no gradient for it
    outputs=("loss",), summary="LigerKLDivLossFunction (log_target=False, eps=1e-10)",
)


def jsd(input, target, labels, beta):
    """Generalised Jensen-Shannon divergence of distillation (Agarwal et al. 2024, GKD): input and
    target are log Q (student) and log P (teacher); beta 0 is KL(P||Q), 1 is KL(Q||P); summed over
    the vocabulary, averaged over the rows whose label is kept. Computed in float32, returned in the
    input's dtype (as Liger's own test reference does)."""
    log_q, log_p = _upcast(input), _upcast(target)
    q, p = log_q.exp(), log_p.exp()
    if beta == 0.0:
        rows = (p * (log_p - log_q)).sum(-1)
    elif beta == 1.0:
        rows = (q * (log_q - log_p)).sum(-1)
    else:
        log_m = torch.log(beta * p + (1 - beta) * q)
        rows = (beta * p * (log_p - log_m) + (1 - beta) * q * (log_q - log_m)).sum(-1)
    kept = labels != -100
    loss = torch.where(kept, rows, torch.zeros_like(rows)).sum() / kept.sum()
    return loss.to(input.dtype)


LABELS = Tensor("tokens", dtype=torch.int64, values=Integers(0, "vocab", {-100: 0.2}))
TOKENS_KEPT = Dim(2, 1024, special=(2, 3, 64, 257))  # two rows at least: one row of a fifth ignored is 0/0

JSD = Op(
    "jsd", reference=jsd,
    inputs={"input": Tensor("tokens", "vocab", values=_log_probabilities),
            "target": Tensor("tokens", "vocab", values=_log_probabilities), "labels": LABELS},
    dims={"tokens": TOKENS_KEPT, "vocab": VOCAB}, params={"beta": Choice(0.5, 0.1, 0.0, 1.0)},
    differentiable=("input",), outputs=("loss",),
    summary="LigerJSDFunction (shift_labels, ignore_index=-100)",
)


def tvd(p, q, labels):
    """Total variation distance, 0.5 |p - q| summed over the vocabulary, averaged over kept rows
    (batchmean), in float32 (Liger's loss is float32)."""
    rows = 0.5 * (_upcast(p) - _upcast(q)).abs().sum(-1)
    kept = labels != -100
    return torch.where(kept, rows, torch.zeros_like(rows)).sum() / kept.sum()


TVD = Op(
    "tvd", reference=tvd,
    inputs={"p": Tensor("tokens", "vocab", values="probabilities"), "q": Tensor("tokens", "vocab", values="probabilities"),
            "labels": LABELS},
    dims={"tokens": TOKENS_KEPT, "vocab": VOCAB}, differentiable=("p",), outputs=("loss",),
    summary="LigerTVDLossFunction (reduction='batchmean', shift_labels)",
)


def fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, labels, beta, temperature):
    """GKD's distillation head: both LM heads in the inputs' dtype, logits upcast to float32 and
    divided by the temperature, log_softmax, then the generalised JSD of ``jsd``."""
    student = torch.log_softmax(_upcast(student_input @ student_weight.T) / temperature, dim=-1)
    teacher = torch.log_softmax(_upcast(teacher_input @ teacher_weight.T) / temperature, dim=-1)
    return jsd(student, teacher, labels, beta)


FUSED_LINEAR_JSD = Op(
    "fused_linear_jsd", reference=fused_linear_jsd,
    inputs={"student_input": Tensor("tokens", "hidden"), "student_weight": Tensor("vocab", "hidden", values="small"),
            "teacher_input": Tensor("tokens", "hidden"), "teacher_weight": Tensor("vocab", "hidden", values="small"),
            "labels": LABELS},
    dims={"tokens": TOKENS_KEPT, "hidden": Dim(1, 512, special=(1, 7, 64)), "vocab": Dim(2, 8192, special=(2, 7, 1000, 4097))},
    params={"beta": Choice(0.5, 0.0, 1.0), "temperature": Choice(1.0, 2.0)},
    differentiable=("student_input", "student_weight"), outputs=("loss",),
    summary="LigerFusedLinearJSDFunction: two LM heads and the JSD",
)

# --- position embeddings and attention ---------------------------------------------------------------------

ROTARY_BASE = 10000.0


def _positions(kinds: int, batch: int, seq: int) -> torch.Tensor:
    """(kinds, batch, seq) positions: temporal, height and width differ, as Qwen2-VL's vision tokens do."""
    s = torch.arange(seq, dtype=torch.float64)
    return torch.stack([torch.stack([(s + b) // (1 + t) for b in range(batch)]) for t in range(kinds)])


def _mrope_angles(shape) -> torch.Tensor:
    kinds, batch, seq, width = shape
    half = width // 2
    inverse_frequency = ROTARY_BASE ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = _positions(kinds, batch, seq)[..., None] * inverse_frequency
    return torch.cat((angles, angles), -1)


def _mrope_cos(shape, dtype, generator, device):
    return _mrope_angles(shape).cos().to(dtype=dtype, device=device)


def _mrope_sin(shape, dtype, generator, device):
    return _mrope_angles(shape).sin().to(dtype=dtype, device=device)


def mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL's split of the rotary half into temporal, height and width parts ([16, 24, 24] at 128)."""
    half = head_dim // 2
    spatial = 3 * half // 8
    return [half - 2 * spatial, spatial, spatial]


def _rotate_half(x):
    first, second = x.chunk(2, -1)
    return torch.cat((-second, first), -1)


def qwen2vl_mrope(q, k, cos, sin):
    """HF's apply_multimodal_rotary_pos_emb: each part of the head dim takes its own kind of
    position's table, then x cos + rotate_half(x) sin in the tables' dtype."""
    sections = mrope_section(q.shape[-1]) * 2
    cos = torch.cat([part[i % 3] for i, part in enumerate(cos.split(sections, dim=-1))], dim=-1).unsqueeze(1)
    sin = torch.cat([part[i % 3] for i, part in enumerate(sin.split(sections, dim=-1))], dim=-1).unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


HEAD_HALVES = Dim(4, 64, special=(4, 8, 16, 32, 64), multiple=4)  # head dims 8..128 in steps of 8

QWEN2VL_MROPE = Op(
    "qwen2vl_mrope", reference=qwen2vl_mrope,
    inputs={"q": Tensor("batch", "heads", "seq", ("half", 2)), "k": Tensor("batch", "kv_heads", "seq", ("half", 2)),
            "cos": Tensor(3, "batch", "seq", ("half", 2), values=_mrope_cos),
            "sin": Tensor(3, "batch", "seq", ("half", 2), values=_mrope_sin)},
    dims={"batch": Dim(1, 4, special=(1, 2)), "heads": Dim(1, 16, special=(1, 2, 4, 7)),
          "kv_heads": Dim(1, 8, special=(1, 2, 3)), "seq": Dim(1, 512, special=(1, 7, 64, 129)), "half": HEAD_HALVES},
    differentiable=("q", "k"), outputs=("q_out", "k_out"),
    summary="LigerQwen2VLMRopeFunction: HF's apply_multimodal_rotary_pos_emb",
)


def _llama4_freqs(shape, dtype, generator, device):
    """(seq, half, 2): cos and sin of Llama 4's angles, the real view of its complex freqs_cis."""
    seq, half, _ = shape
    inverse_frequency = 500000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * inverse_frequency
    return torch.stack((angles.cos(), angles.sin()), -1).to(dtype=dtype, device=device)


def llama4_rope(q, k, freqs):
    """HF's Llama 4 apply_rotary_emb: pairs (x[2i], x[2i+1]) as complex numbers in float32, times
    freqs_cis, back to the input's dtype; the complex product written out, (ac - bd, ad + bc)."""
    c, s = freqs[None, :, None, :, 0], freqs[None, :, None, :, 1]

    def rotate(x):
        pairs = _upcast(x).unflatten(-1, (-1, 2))
        re, im = pairs[..., 0], pairs[..., 1]
        return torch.stack((re * c - im * s, re * s + im * c), -1).flatten(-2).to(x.dtype)

    return rotate(q), rotate(k)


LLAMA4_ROPE = Op(
    "llama4_rope", reference=llama4_rope,
    inputs={"q": Tensor("batch", "seq", "heads", ("half", 2)), "k": Tensor("batch", "seq", "kv_heads", ("half", 2)),
            "freqs": Tensor("seq", "half", 2, dtype="float32", values=_llama4_freqs)},
    dims={"batch": Dim(1, 4, special=(1, 2)), "seq": Dim(1, 512, special=(1, 7, 64, 129)),
          "heads": Dim(1, 16, special=(1, 2, 5)), "kv_heads": Dim(1, 8, special=(1, 2, 3)),
          "half": Dim(1, 64, special=(1, 4, 16, 32, 64))},
    differentiable=("q", "k"), outputs=("q_out", "k_out"),
    summary="LigerLlama4RopeFunction: HF's Llama 4 apply_rotary_emb (real view of freqs_cis)",
)

MTA_KERNEL = 3


def multi_token_attention(scores, weight, bias):
    """Multi-token attention (Golovneva et al. 2025), pre-softmax-free form Liger implements: causal
    scores (the upper triangle masked to -inf), softmax over keys, a 3x3 convolution across query
    and key positions (padding 1), the upper triangle zeroed."""
    length = scores.shape[-1]
    future = torch.ones(length, length, dtype=torch.bool, device=scores.device).triu(1)
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    mixed = F.conv2d(probs, weight, bias, padding=MTA_KERNEL // 2)
    return mixed.masked_fill(future, 0.0)


MULTI_TOKEN_ATTENTION = Op(
    "multi_token_attention", reference=multi_token_attention,
    inputs={"scores": Tensor("batch", "channels", "length", "length"),
            "weight": Tensor("channels", "channels", MTA_KERNEL, MTA_KERNEL, values="small"),
            "bias": Tensor("channels", values="small")},
    dims={"batch": Dim(1, 4, special=(1, 2)), "channels": Dim(1, 8, special=(1, 2, 3)),
          "length": Dim(1, 128, special=(1, 2, 7, 16, 33, 65))},
    outputs=("out",), value_kinds=("normal", "large", "tiny", "outliers"),
    summary="LigerMultiTokenAttentionFunction (softmax, 3x3 kernel, padding 1)",
)


# Modules of liger_kernel/ops/ with no declaration here, and why (the findings' table lists them too).
NOT_DECLARED = {
    "rms_norm, rope, swiglu, geglu": "built-in ops of the harness, covered by --impl liger",
    "grpo_loss": "TRL's GRPO loss has many modes (loss_type, importance sampling, clipping, KL); one "
                 "reference per mode is a project of its own, not declared in this session",
    "fused_neighborhood_attention": "not declared in this session (a sliding-window attention reference "
                                    "and its masks)",
    "attn_res": "not declared in this session (Kimi's attention residuals over depth blocks)",
    "fused_ce_tvd, fused_linear_kl_div": "not declared in this session; their parts are (cross_entropy, "
                                         "tvd, kl_div, fused_linear_jsd)",
    "mhc": "not declared in this session (manifold hyper-connections: Sinkhorn iterations, many outputs)",
    "fused_moe, fused_moe_kernels": "routing by precomputed top-k indices and grouped GEMMs; not declared "
                                    "in this session",
    "mlp": "TMA tensor descriptors (a Hopper-only fused MLP): no CPU path under Triton's interpreter",
    "tiled_mlp": "no Triton kernel: a torch.autograd.Function that recomputes an MLP tile by tile",
    "vocab_parallel_cross_entropy, fused_linear_scaled_cross_entropy (TP)": "needs a torch.distributed "
                                                                           "process group",
    "fused_linear_scaled_cross_entropy": "CUDA-only dispatch, falls back to torch on any other device",
    "experimental/embedding, cute/, cutedsl/, cutile/, backends/": "not Triton (CuTe DSL, cuTile) or "
                                                                   "experimental",
}
