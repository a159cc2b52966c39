"""Liger-Kernel 0.8.5's op set (``liger_kernel/ops/``) under the harness, beside the four ops the
built-in adapter already covers (``--impl liger``: rms_norm, rope, swiglu, geglu).

    pip install --no-deps liger-kernel==0.8.5
    pytest --pyargs oracle.suite --op-module peers.liger.ops --impl peers.liger.impl:impl --ops group_norm -n auto

``ops`` declares what each kernel computes, each reference written here in plain torch from the
maths of the model or paper the kernel serves; ``impl`` calls Liger's own autograd Functions with the
defaults ``liger_kernel.transformers`` uses. ``ops.NOT_DECLARED`` lists the modules of
``liger_kernel/ops/`` left out, each with its reason.
"""
