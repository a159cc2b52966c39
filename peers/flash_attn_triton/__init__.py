"""flash-attn's Triton kernels (``flash_attn/ops/triton/``), without its CUDA extension.

    pip download --no-deps --no-binary :all: --no-build-isolation flash-attn==2.8.3 -d .whl   # the sdist
    pip install einops                                       # flash_attn.layers.rotary imports it
    FLASH_ATTN_SOURCE=.whl/flash_attn-2.8.3.tar.gz pytest --pyargs oracle.suite \\
        --op-module peers.flash_attn_triton.ops --impl peers.flash_attn_triton.impl:impl -n auto

``ops`` declares what the kernels compute; ``impl`` loads them from the sdist (only the pure-Python
files the kernels need) and calls them as flash-attn's own modules do.
"""
