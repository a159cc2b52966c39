"""The benchmark's JSON schema and the targets it holds the kernels to: read by the benchmark
(oracle/bench/__init__.py) and by its plot (oracle/bench/plot.py), which therefore need not import each other."""

SCHEMA = "kernel-oracle/bench/2"

FWD_TARGET = 0.85  # forward GPU bandwidth over the copy's
FWD_TARGET_NARROW = 0.70  # ... on sweep rows narrower than NARROW_BELOW columns
NARROW_BELOW = 256
FWD_BWD_TARGET = 1.0  # forward+backward GPU time over the fastest fast peer's
# At model shapes, wall per call (an unsynchronised loop's, forward and forward+backward) no slower than WALL_PEER's.
OURS, FAST_PEERS, MEMORY_PEER, WALL_PEER = "kernels", ("compile", "liger"), "compile", "compile"
