"""Unsloth 2026.10.9's LoRA autograd Functions and its fast cross-entropy under the harness, beside
the kernels the built-in adapter covers (``--impl unsloth``: RMSNorm, RoPE, the raw SwiGLU and
GeGLU kernels).

    pip install --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9
    pytest --pyargs oracle.suite --op-module peers.unsloth.ops --impl peers.unsloth.impl:impl -n auto

``ops`` declares what each Function computes, its reference PEFT's LoRA layer (``base(x) +
lora_B(lora_A(x)) * scaling``) and HF's causal-LM loss, written here in plain torch; ``impl`` calls
Unsloth's own Functions (``LoRA_MLP``, ``LoRA_QKV``, ``LoRA_W``, ``fast_cross_entropy_loss``) as its
``apply_lora_*`` model code does. On a CPU, Unsloth refuses to import unless its own test-only switch
``UNSLOTH_ALLOW_CPU=1`` is set; with it the Triton kernels run under the interpreter.
"""
