"""Liger-Kernel 0.8.5's counterparts of the declared ops, behind the declarations' signatures
(on a GPU, with liger-kernel installed): each called with Liger's defaults."""

from oracle import implementation


def _liger():
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    def cross_entropy(logits, target):
        return LigerCrossEntropyFunction.apply(logits, target, None, -100)[0]

    return implementation(
        NO_FLOAT64={"layer_norm", "fused_add_rms_norm", "cross_entropy", "softmax"},  # Liger computes in float32
        layer_norm=lambda X, W, B, eps: LigerLayerNormFunction.apply(X, W, B, eps),
        # Llama's casting, not in place: the declaration's HF maths
        fused_add_rms_norm=lambda X, R, W, eps: LigerFusedAddRMSNormFunction.apply(X, R, W, eps, 0.0, "llama", False),
        cross_entropy=cross_entropy,
        softmax=lambda X: LigerSoftmaxFunction.apply(X),
    )


liger = _liger()
