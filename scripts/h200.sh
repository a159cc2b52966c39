#!/usr/bin/env bash
# One call on the lent H200 (../shared/gpu.md): install what the image lacks, then run the steps
# named on the command line, each logging under $OUT. Usage (device tool, carry .whl):
#   bash scripts/h200.sh info landing                     # what a landing needs: the whole suite, then a short random sample
#   bash scripts/h200.sh startup                          # where the suite's start-up goes (imports, collection, bytecode)
#   bash scripts/h200.sh info tests thorough liger-tests
#   bash scripts/h200.sh report liger-report bench      # bench: carry liger-kernel's wheel in .whl
#   bash scripts/h200.sh tune-rms-norm host-profile       # tune-rms-norm: two GPUs, a pass each
#   VARIANT=gemma bash scripts/h200.sh tune-backward      # one GPU: the backward's widths (Llama's by default)
#   bash scripts/h200.sh tune-parts                       # the forward at 65536/32768 columns, programs sharing a row
#   bash scripts/h200.sh rope-group                       # RoPE's heads per program against compile's
#   bash scripts/h200.sh rope-positions smem-forward      # plain RoPE against packed; the shared-memory forward, ncu
#   bash scripts/h200.sh rope-tokens                      # RoPE with several tokens a program, K's heads apart
#   bash scripts/h200.sh overlap-forward                  # RMSNorm's forward, two rows' sweeps in one loop
#   bash scripts/h200.sh rope-order                       # RoPE's programs in another order (the table's rows in L2)
#   bash scripts/h200.sh rope-persistent                  # RoPE with a few persistent programs an SM
#   bash scripts/h200.sh rope-eviction                    # RoPE with L2 eviction hints on its loads and stores
#   bash scripts/h200.sh rope-placement                   # RoPE's tensors at chosen addresses, timed per placement
#   bash scripts/h200.sh rope-floor                       # plain RoPE rung by rung, from torch's neg to the kernel
#   bash scripts/h200.sh backward-floor                   # RMSNorm's backward rung by rung, from a copy to the kernel
#   bash scripts/h200.sh dw-sum                           # the dW partial rows' sum with fewer columns a program
#   bash scripts/h200.sh backward-ab                      # carry .whl: RMSNorm's backward against Liger's, ncu too
#   PROFILE_IMPL=hf PROFILE_OP=rms_norm bash scripts/h200.sh drawn-profile  # thorough examples, derived vs declared
#   IMPL=hf bash scripts/h200.sh thorough-impl          # the thorough profile for another implementation
#   bash scripts/h200.sh unsloth-tests unsloth-report   # .whl holds unsloth and unsloth_zoo 2026.10.9
#   bash scripts/h200.sh scale sanitize                 # the full sweep + scale grid as the baseline; compute-sanitizer
#   bash scripts/h200.sh flash-attn-tests flash-attn-report  # carry .peers: flash-attn's sdist and einops (peers/flash_attn_triton)
#   bash scripts/h200.sh noise-tables compile-bench    # the derived noise model's tables; the kernels inside compiled models
#   bash scripts/h200.sh liger-peer                     # carry .peers: Liger-Kernel 0.8.5's wheel (peers/liger)
#   bash scripts/h200.sh liger-autotune liger-peer-report liger-scale-margin  # .peers also holds 0.6.4's under .peers/old
#   bash scripts/h200.sh unsloth-peer                   # carry .peers: unsloth and unsloth_zoo 2026.10.9 (peers/unsloth)
#   bash scripts/h200.sh mutate                         # python -m oracle.mutate on every built-in op (one call, <= 8 min)
#   MUTATE_LIGER_OPS="layer_norm softmax" bash scripts/h200.sh mutate-liger mutate-unsloth  # carry .peers
# With several GPUs, `monitor` logs each GPU's utilisation and memory every 2 s until the call ends.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | grep -v "already exists" || true
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD"
fi
FLASH_ATTN_OPS="fa_rotary fa_rotary_varlen fa_add_rms_norm fa_add_layer_norm"
flash_attn() {  # a command with flash-attn's source and einops (carried in .peers) at hand
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .peers/einops-*.whl 2>&1 \
    | grep -v "already exists" || true
  PYTHONPATH="$PWD:/tmp/site" FLASH_ATTN_SOURCE=$(ls .peers/flash_attn-*.tar.gz) "$@"
}
LIGER_OPS="layer_norm fused_add_rms_norm group_norm poly_norm modulated_rms_norm dyt softmax sparsemax relu_squared
  cross_entropy fused_linear_cross_entropy kl_div jsd tvd fused_linear_jsd qwen2vl_mrope llama4_rope multi_token_attention"
liger_peer() {  # a command with Liger-Kernel 0.8.5 (its wheel carried in .peers) at hand, for peers/liger only
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/liger .peers/liger_kernel-*.whl 2>&1 \
    | grep -v "already exists" || true
  PYTHONPATH="$PWD:/tmp/liger" "$@"
}
for step in "$@"; do
  echo "=== $step $(date +%T)"
  case $step in
    info)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
      python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())";;
    smoke)
      CI=true timeout 420 python3 -m pytest -n 8 -q -p no:cacheprovider tests/test_kernels.py tests/test_reference.py \
        tests/test_runtime.py tests/test_ops.py tests/test_engine.py tests/test_aliasing.py 2>&1 | tee "$OUT/pytest-smoke.log" | tail -45;;
    monitor)
      nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 2 > "$OUT/gpu-usage.csv" &;;
    mutate)  # mutation testing of this repository's kernels, every built-in op at once (docs/howto/how-strong-is-my-test.md)
      timeout ${MUTATE_TIMEOUT:-480} python3 -m oracle.mutate --impl kernels ${MUTATE_OPS:+--ops $(echo $MUTATE_OPS | tr ' ' ,)} \
        --time-limit $(( ${MUTATE_TIMEOUT:-480} - 90 )) \
        --json "$OUT/mutate-kernels-h200.json" > "$OUT/mutate-kernels-h200.txt" 2> "$OUT/mutate-kernels-h200.err"
      echo "mutate exit $?"; grep -v "^      " "$OUT/mutate-kernels-h200.txt" | head -40; tail -3 "$OUT/mutate-kernels-h200.err";;
    mutate-liger)  # Liger-Kernel 0.8.5's declared ops (peers/liger; carry .peers)
      liger_peer timeout ${MUTATE_TIMEOUT:-300} python3 -m oracle.mutate --op-module peers.liger.ops \
        --impl peers.liger.impl:impl --ops "$(echo ${MUTATE_LIGER_OPS:-$LIGER_OPS} | tr ' ' ,)" \
        --time-limit $(( ${MUTATE_TIMEOUT:-300} - 60 )) \
        --json "$OUT/mutate-liger-h200.json" > "$OUT/mutate-liger-h200.txt" 2> "$OUT/mutate-liger-h200.err"
      echo "mutate-liger exit $?"; grep -v "^      " "$OUT/mutate-liger-h200.txt" | head -30; tail -3 "$OUT/mutate-liger-h200.err";;
    mutate-softmax)  # the tutorial's softmax (docs/howto/how-strong-is-my-test.md), on the GPU
      (cd docs/tutorial && PYTHONPATH="$PWD/../..:$PWD" timeout ${MUTATE_TIMEOUT:-120} python3 -m oracle.mutate \
        --op-module softmax_ops --impl softmax_triton:impl --ops softmax --json "$OUT/mutate-softmax-h200.json" \
        > "$OUT/mutate-softmax-h200.txt" 2>/dev/null)
      echo "mutate-softmax exit $?"; grep -v "^      " "$OUT/mutate-softmax-h200.txt" | head -12;;
    mutate-unsloth)  # Unsloth's declared ops (peers/unsloth; carry .peers)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/unsloth .peers/unsloth*.whl 2>&1 \
        | grep -v "already exists" || true
      PYTHONPATH="$PWD:/tmp/unsloth" timeout ${MUTATE_TIMEOUT:-300} python3 -m oracle.mutate --op-module peers.unsloth.ops \
        --impl peers.unsloth.impl:impl --ops lora_mlp,lora_qkv,lora_o,fast_cross_entropy \
        --time-limit $(( ${MUTATE_TIMEOUT:-300} - 60 )) --json "$OUT/mutate-unsloth-h200.json" > "$OUT/mutate-unsloth-h200.txt" \
        2> "$OUT/mutate-unsloth-h200.err"
      echo "mutate-unsloth exit $?"; grep -v "^      " "$OUT/mutate-unsloth-h200.txt" | head -30; tail -3 "$OUT/mutate-unsloth-h200.err";;
    landing)  # one call of at most 8 minutes (docs/howto/gpu-scale-and-sanitizer.md): failures named as they come (-v
      # into the log), so a run cut by its limit still tells which; each line stamped with its second, so that
      # scripts/worker_timeline.py can say where the wall time went; then a short random sample of the generic suite
      # WORKERS: xdist's worker count (default auto: one per core), to measure the suite with fewer
      # processes time-slicing the one GPU
      # The image ships no bytecode and sets PYTHONDONTWRITEBYTECODE=1, so every process compiled torch's modules
      # from source (5.6 s of a collection: `startup`), the child sessions and reports the tests start too. A CI
      # machine's pip writes bytecode at install; here the run writes it, outside the image, as it goes: the
      # workers compile what they import first, and every process after them reads it.
      PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/pycache CI=true timeout ${TESTS_TIMEOUT:-300} \
        python3 -m pytest -n ${WORKERS:-auto} -v -p no:cacheprovider \
        --durations=${DURATIONS:-15} 2>&1 | python3 scripts/worker_timeline.py stamp > "$OUT/pytest-h200.log"
      echo "suite exit $?"; grep -E "(FAILED|ERROR) |^ *[0-9.]+ [0-9.]+s (call|setup|teardown) | (passed|failed).* in " \
        "$OUT/pytest-h200.log" | tail -40
      python3 scripts/worker_timeline.py summary "$OUT/pytest-h200.log"
      # SIGINT first: pytest then stops its xdist workers, which a plain SIGTERM to the controller leaves running
      # (a step after it, the benchmark above all, would share the machine with them)
      HYPOTHESIS_PROFILE=sample timeout -s INT -k 20 ${SAMPLE_TIMEOUT:-120} python3 -m pytest -n auto -q -p no:cacheprovider \
        tests/test_ops.py -k matches_hf 2>&1 | tee "$OUT/pytest-sample-h200.log" | grep -E "FAILED|ERROR|passed|failed";;
    startup)  # where the suite's first seconds go: 16 collections at once (as xdist's workers start), then one
      # alone, profiled; whether this machine writes bytecode (pytest's rewritten test modules are cached there)
      env | grep -E "^PYTHON" || echo "no PYTHON* variables"; nproc
      TIMEFORMAT="%R s"; echo "16 collections at once:"
      time (for i in $(seq 16); do CI=true python3 -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 & done; wait)
      ls -d tests/__pycache__ 2>/dev/null || echo "no tests/__pycache__"
      echo "one collection:"; time (CI=true python3 -m cProfile -o /tmp/collect.prof -m pytest --collect-only -q \
        -p no:cacheprovider >/dev/null 2>&1)
      python3 -c "import pstats; pstats.Stats('/tmp/collect.prof').sort_stats('cumulative').print_stats(60)" \
        > "$OUT/collect-profile-h200.txt"; grep -E "pytest_configure|perform_collect|_rewrite_test|import_path" \
        "$OUT/collect-profile-h200.txt" | head;;
    tests)
      CI=true timeout ${TESTS_TIMEOUT:-400} python3 -m pytest -n auto -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest-h200.log" | tail -25;;
    thorough)
      HYPOTHESIS_PROFILE=thorough timeout ${THOROUGH_TIMEOUT:-420} python3 -m pytest -n auto -q -p no:cacheprovider tests/test_ops.py \
        -k "matches_hf ${THOROUGH_OPS:+and $THOROUGH_OPS}" 2>&1 | tee "$OUT/pytest-thorough-h200.log" | tail -22;;
    thorough-impl)
      HYPOTHESIS_PROFILE=thorough timeout ${THOROUGH_TIMEOUT:-300} python3 -m pytest -n auto -q -p no:cacheprovider tests/test_ops.py \
        -k matches_hf --impl "$IMPL" 2>&1 | tee "$OUT/pytest-thorough-$IMPL-h200.log" | tail -22;;
    report-one-gpu)  # the same full sweep on one GPU only, to compare with a multi-GPU run
      CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m oracle.report --full --json "$OUT/drift-h200-one-gpu.json" \
        --html /tmp/one.html 2>&1 | tee "$OUT/report-one-gpu.log" | tail -8;;
    liger-tests)
      CI=true timeout 300 python3 -m pytest -n 8 -q -p no:cacheprovider tests/test_ops.py --impl liger 2>&1 \
        | tee "$OUT/pytest-liger-h200.log" | tail -30;;
    unsloth-tests)  # Unsloth's kernels (peers/unsloth/adapter.py; carry its two wheels in .whl): the generic suite
      CI=true timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -n auto -p no:cacheprovider tests/test_ops.py --impl unsloth \
        2>&1 | tee "$OUT/pytest-unsloth-h200.log" | tail -30
      CI=true timeout 200 python3 -m pytest -n auto -p no:cacheprovider tests/test_ops.py --impl unsloth-inplace \
        2>&1 | tee "$OUT/pytest-unsloth-inplace-h200.log" | tail -15;;
    flash-attn-tests)  # flash-attn's Triton kernels (peers/flash_attn_triton): carry .peers, its sdist and einops' wheel;
      # every result named in the log as it comes, so a run cut by its limit still says which failed
      CI=true flash_attn timeout ${PEERS_TIMEOUT:-200} python3 -m pytest -n auto -v -p no:cacheprovider --durations=10 \
        --pyargs oracle.suite --op-module peers.flash_attn_triton.ops --impl peers.flash_attn_triton.impl:impl \
        --ops "${FLASH_ATTN_OPS// /,}" > "$OUT/pytest-flash-attn-h200.log" 2>&1
      echo "flash-attn exit $?"; grep -E "(FAILED|ERROR) |^E  .{0,160}$| (passed|failed).* in " \
        "$OUT/pytest-flash-attn-h200.log" | head -80 || true;;
    liger-peer)  # Liger-Kernel 0.8.5's op set (peers/liger; carry .peers, its wheel): every case named in the log
      CI=true liger_peer timeout ${LIGER_TIMEOUT:-200} python3 -m pytest -n auto -v -p no:cacheprovider --durations=10 \
        --pyargs oracle.suite --op-module peers.liger.ops --impl peers.liger.impl:impl --ops "$(echo $LIGER_OPS | tr ' ' ,)" \
        > "$OUT/pytest-liger-peer-h200.log" 2>&1
      echo "liger-peer exit $?"; grep -E "(FAILED|ERROR) | (passed|failed).* in " "$OUT/pytest-liger-peer-h200.log" | tail -60
      grep -cE " PASSED" "$OUT/pytest-liger-peer-h200.log";;
    liger-autotune)  # the 60 s target of an autotuned op's generic suite: Liger's DyT (18 configs keyed on the width,
      # forward and backward), each case judging one config (oracle/engine/autotune.py), wall time of the whole pytest run
      TIMEFORMAT="dyt suite wall %R s"; time (CI=true liger_peer timeout ${AUTOTUNE_TIMEOUT:-120} python3 -m pytest -n auto -v \
        -p no:cacheprovider --pyargs oracle.suite --op-module peers.liger.ops --impl peers.liger.impl:impl --ops dyt \
        > "$OUT/pytest-liger-dyt-h200.log" 2>&1); grep -E "(FAILED|ERROR) | (passed|failed).* in " "$OUT/pytest-liger-dyt-h200.log";;
    case-profile)  # where one op's cases spend their time (PROFILE_ARGS: scripts/case_profile.py's arguments; carry .peers for Liger's)
      liger_peer timeout ${PROFILE_TIMEOUT:-120} python3 scripts/case_profile.py $PROFILE_ARGS 2>&1 \
        | tee "$OUT/case-profile-h200.log" | head -${PROFILE_LINES:-60};;
    liger-peer-report)  # Liger's op set through the report's sweep, then compute-sanitizer's memcheck (carry .peers)
      liger_peer timeout ${REPORT_TIMEOUT:-150} python3 -m oracle.report --op-module peers.liger.ops \
        --impl peers.liger.impl:impl --ops $LIGER_OPS --workers ${REPORT_WORKERS:-16} --json "$OUT/drift-liger-peer-h200.json" \
        --html "$OUT/drift-liger-peer-h200.html" > "$OUT/report-liger-peer-h200.log" 2>&1
      echo "report exit $?"; tail -30 "$OUT/report-liger-peer-h200.log"
      liger_peer timeout ${SANITIZE_TIMEOUT:-150} python3 -m oracle.sanitize --op-module peers.liger.ops \
        --impl peers.liger.impl:impl --ops $LIGER_OPS --tools ${SANITIZE_TOOLS:-memcheck} --jobs ${SANITIZE_JOBS:-8} \
        --json "$OUT/sanitize-liger-peer-h200.json" > "$OUT/sanitize-liger-peer-h200.log" 2>&1
      echo "sanitize exit $?"; tail -30 "$OUT/sanitize-liger-peer-h200.log";;
    liger-scale-margin)  # issue 35: Liger 0.6.4 (its bf16 dW partial sums, Liger #950) against 0.8.5 over RMSNorm's bf16
      # scale cells, judged by the derived noise model (carry .peers: both wheels, 0.6.4 under .peers/old)
      for version in old new; do
        wheel=$([ $version = old ] && ls .peers/old/liger_kernel-*.whl || ls .peers/liger_kernel-*.whl)
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/liger-$version $wheel 2>&1 | grep -v "already exists"
        ORACLE_NOISE_MODEL=derived PYTHONPATH="$PWD:/tmp/liger-$version" timeout ${SCALE_TIMEOUT:-200} python3 -m oracle.report \
          --impl liger --scale --no-checks --ops rms_norm --dtypes bfloat16 --variants ${SCALE_VARIANTS:-llama gemma} \
          --json "$OUT/drift-liger-$version-scale-h200.json" \
          --html /tmp/liger-$version.html > "$OUT/report-liger-$version-scale-h200.log" 2>&1
        echo "$wheel: exit $?"; tail -4 "$OUT/report-liger-$version-scale-h200.log"
      done;;
    unsloth-peer)  # Unsloth's LoRA Functions and fast cross-entropy (peers/unsloth; carry its two wheels in .peers)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/unsloth .peers/unsloth*.whl 2>&1 \
        | grep -v "already exists" || true
      CI=true PYTHONPATH="$PWD:/tmp/unsloth" timeout ${UNSLOTH_TIMEOUT:-200} python3 -m pytest -n auto -v -p no:cacheprovider \
        --durations=10 --pyargs oracle.suite --op-module peers.unsloth.ops --impl peers.unsloth.impl:impl \
        > "$OUT/pytest-unsloth-peer-h200.log" 2>&1
      echo "unsloth-peer exit $?"; grep -E "(FAILED|ERROR) |^E   .*(FAIL|declaration problem)|^E   .*\[[a-z-]+\] | (passed|failed).* in " \
        "$OUT/pytest-unsloth-peer-h200.log" | cut -c1-260 | head -60;;
    flash-attn-report)  # the report's sweep and compute-sanitizer on flash-attn's kernels (carry .peers; REPORT_WORKERS:
      # its autotuned kernels compile per config and width, about 9 s a case on one worker)
      flash_attn timeout ${REPORT_TIMEOUT:-200} python3 -m oracle.report --op-module peers.flash_attn_triton.ops \
        --impl peers.flash_attn_triton.impl:impl --ops $FLASH_ATTN_OPS ${REPORT_WORKERS:+--workers $REPORT_WORKERS} \
        --json "$OUT/drift-flash-attn-h200.json" \
        --html "$OUT/drift-flash-attn-h200.html" 2>&1 | tee "$OUT/report-flash-attn-h200.log" | tail -25
      flash_attn timeout ${SANITIZE_TIMEOUT:-200} python3 -m oracle.sanitize --op-module peers.flash_attn_triton.ops \
        --impl peers.flash_attn_triton.impl:impl --ops $FLASH_ATTN_OPS --json "$OUT/sanitize-flash-attn-h200.json" 2>&1 \
        | tee "$OUT/sanitize-flash-attn-h200.log" | tail -25;;
    flash-attn-sanitize)  # compute-sanitizer alone on flash-attn's kernels (carry .peers): FA_SANITIZE_OPS, SANITIZE_TOOLS
      flash_attn timeout ${SANITIZE_TIMEOUT:-200} python3 -m oracle.sanitize --op-module peers.flash_attn_triton.ops \
        --impl peers.flash_attn_triton.impl:impl --ops ${FA_SANITIZE_OPS:-$FLASH_ATTN_OPS} --tools ${SANITIZE_TOOLS:-memcheck} \
        --jobs ${SANITIZE_JOBS:-4} --json "$OUT/sanitize-flash-attn-h200.json" > "$OUT/sanitize-flash-attn-h200.log" 2>&1
      echo "sanitize exit $?"; tail -25 "$OUT/sanitize-flash-attn-h200.log";;
    compile-bench)  # a Llama layer and small Llama and Gemma 3 models trained under torch.compile, with and without the kernels
      timeout ${COMPILE_TIMEOUT:-240} python3 scripts/compile_bench.py ${COMPILE_ONLY:+--only "$COMPILE_ONLY"} \
        --json "$OUT/compile-bench-h200${COMPILE_ONLY:+-$COMPILE_ONLY}.json" 2>&1 \
        | tee "$OUT/compile-bench-h200${COMPILE_ONLY:+-$COMPILE_ONLY}.log" | grep -v Warning | tail -12;;
    unsloth-report)
      timeout ${REPORT_TIMEOUT:-300} python3 -m oracle.report --impl unsloth --full --json "$OUT/drift-unsloth-h200.json" \
        --html "$OUT/drift-unsloth-h200.html" 2>&1 | tee "$OUT/report-unsloth-h200.log" | tail -40;;
    profile)
      timeout 300 python3 scripts/gpu_profile.py 2>&1 | tee "$OUT/profile.log";;
    tune)
      timeout 300 python3 scripts/tune.py 2>&1 | tee "$OUT/tune.log";;
    tune-rms-norm)  # RMSNorm's launch table, one pass per GPU (two at least); merge here with --merge
      if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then  # both passes on one GPU would time each other's load
        echo "tune-rms-norm needs two GPUs; on one, run tune-backward (or tune_rms_norm.py --pass forward) alone"
        continue
      fi
      CUDA_VISIBLE_DEVICES=0 timeout 400 python3 scripts/tune_rms_norm.py --pass forward --out "$OUT/tune-forward.json" \
        > "$OUT/tune-forward.log" 2>&1 &
      CUDA_VISIBLE_DEVICES=$(( $(nvidia-smi -L | wc -l) - 1 )) timeout 400 python3 scripts/tune_rms_norm.py --pass backward \
        --out "$OUT/tune-backward.json" > "$OUT/tune-backward.log" 2>&1; wait
      tail -10 "$OUT/tune-forward.log" "$OUT/tune-backward.log";;
    tune-backward)  # RMSNorm's backward at every width on one GPU (VARIANT=gemma for Gemma's), at most 9 min
      timeout 540 python3 scripts/tune_rms_norm.py --pass backward --variant "${VARIANT:-llama}" \
        --out "$OUT/tune-backward-${VARIANT:-llama}.json" 2>&1 | tee "$OUT/tune-backward-${VARIANT:-llama}.log" | tail -10;;
    tune-parts)  # RMSNorm's forward at 65536 and 32768 columns with the parts path's settings, Llama then Gemma
      timeout ${PARTS_TIMEOUT:-150} python3 scripts/tune_rms_norm.py --pass forward --widths 65536,32768 \
        --out "$OUT/tune-forward-llama-parts.json" 2>&1 | tee "$OUT/tune-forward-llama-parts.log" | tail -2
      timeout ${PARTS_TIMEOUT:-150} python3 scripts/tune_rms_norm.py --pass forward --variant gemma --widths 65536 \
        --out "$OUT/tune-forward-gemma-parts.json" 2>&1 | tee "$OUT/tune-forward-gemma-parts.log" | tail -1;;
    backward-floor)  # RMSNorm's backward rung by rung from a copy to the shipped kernel (scripts/backward_floor.py)
      timeout ${FLOOR_TIMEOUT:-150} python3 scripts/backward_floor.py 2>&1 | tee "$OUT/backward-floor-h200.log";;
    dw-sum)  # the launch summing dW's partial rows, 64 to 8 columns a program (scripts/rms_norm_dw_sum_ab.py)
      timeout ${DW_SUM_TIMEOUT:-120} python3 scripts/rms_norm_dw_sum_ab.py 2>&1 | tee "$OUT/dw-sum.log";;
    rope-positions)  # plain RoPE against packed: the position values apart from the code path (scripts/rope_positions_ab.py)
      timeout ${ROPE_POSITIONS_TIMEOUT:-200} python3 scripts/rope_positions_ab.py 2>&1 | tee "$OUT/rope-positions.log";;
    rope-tokens)  # RoPE with several tokens a program and K's heads apart, against the shipped kernel (scripts/rope_tokens_ab.py)
      timeout ${ROPE_TOKENS_TIMEOUT:-200} python3 scripts/rope_tokens_ab.py ${ROPE_TOKENS_ARGS:-} 2>&1 | tee "$OUT/rope-tokens.log";;
    rope-order)  # RoPE's programs decoded in another order, against the shipped kernel (scripts/rope_order_ab.py)
      timeout ${ROPE_ORDER_TIMEOUT:-150} python3 scripts/rope_order_ab.py 2>&1 | tee "$OUT/rope-order.log";;
    rope-persistent)  # RoPE with persistent programs looping over the shipped order's items (scripts/rope_persistent_ab.py)
      timeout ${ROPE_PERSISTENT_TIMEOUT:-150} python3 scripts/rope_persistent_ab.py 2>&1 | tee "$OUT/rope-persistent.log";;
    rope-eviction)  # RoPE's table kept in L2, Q's and K's streams evicted first (scripts/rope_eviction_ab.py)
      timeout ${ROPE_EVICTION_TIMEOUT:-150} python3 scripts/rope_eviction_ab.py 2>&1 | tee "$OUT/rope-eviction.log";;
    rope-placement)  # plain and packed RoPE with their tensors at chosen gaps in one arena (scripts/rope_placement_ab.py)
      timeout ${ROPE_PLACEMENT_TIMEOUT:-240} python3 scripts/rope_placement_ab.py 2>&1 | tee "$OUT/rope-placement.log";;
    rope-floor)  # plain RoPE's forward+backward against rungs doing less: neg, a flat stream, its rows copied
      timeout ${ROPE_FLOOR_TIMEOUT:-150} python3 scripts/rope_floor.py 2>&1 | tee "$OUT/rope-floor.log";;
    overlap-forward)  # RMSNorm's forward at 65536 columns, a row's second sweep fused with the next row's first
      timeout ${OVERLAP_TIMEOUT:-200} python3 scripts/rms_norm_overlap_forward.py 2>&1 | tee "$OUT/overlap-forward.log";;
    smem-forward)  # RMSNorm's forward at 65536 columns, each row in shared memory (Gluon), timed; then ncu on one setting
      timeout ${SMEM_TIMEOUT:-240} python3 scripts/rms_norm_smem_forward.py 2>&1 | tee "$OUT/smem-forward.log"
      timeout 120 ncu --clock-control none -k regex:_smem_forward --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 scripts/rms_norm_smem_forward.py --only ${SMEM_SETTING:-8192,32} --variants llama 2>&1 \
        | tee "$OUT/smem-forward-ncu.log" | tail -60;;
    rope-group)  # RoPE's heads per program against compile's forward+backward (scripts/rope_group_ab.py)
      timeout ${ROPE_GROUP_TIMEOUT:-200} python3 scripts/rope_group_ab.py 2>&1 | tee "$OUT/rope-group-h200.log";;
    backward-ab)  # RMSNorm's backward against Liger-Kernel's at 4096 x 16384 (.whl holds its wheel): timed, then ncu
      timeout 150 python3 scripts/rms_norm_backward_ab.py 2>&1 | tee "$OUT/backward-ab-h200.log"
      timeout 200 ncu --clock-control none -k regex:backward --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 scripts/rms_norm_backward_ab.py --once > "$OUT/backward-ab-ncu-h200.txt" 2>&1
      grep -E "ran$|Duration|Registers Per|Achieved Occupancy|Memory Throughput" "$OUT/backward-ab-ncu-h200.txt" | head -80;;
    host-profile)  # where a call's host time goes (autograd, Triton's launcher, the kernels' Python)
      # the whole log first: head closing a pipe behind tee would cut it at its 20th line
      timeout ${PROFILE_TIMEOUT:-200} python3 scripts/host_profile.py > "$OUT/host-profile-h200.log" 2>&1; head -20 "$OUT/host-profile-h200.log";;
    gate)  # the full sweep and the scale grid, as the committed H200 baseline holds them, gated against it
      timeout ${GATE_TIMEOUT:-560} python3 -m oracle.report --full --scale --gate --json "$OUT/drift-h200.json" \
        --html "$OUT/drift-h200.html" 2>&1 | tee "$OUT/report-h200.log" | tail -30;;
    position-check)
      timeout 120 python3 -m oracle.bench --position-check 2>&1 | tee "$OUT/position-check-h200.log" | tail -20;;
    scale)  # the full sweep and the scale grid in one run, as a baseline (results.baseline_view of the JSON)
      timeout ${SCALE_TIMEOUT:-560} python3 -m oracle.report --full --scale --json "$OUT/drift-h200.json" \
        --html "$OUT/drift-h200.html" --update-baseline --baseline "$OUT/baseline-cuda-NVIDIA-H200.json" 2>&1 \
        | tee "$OUT/report-scale-h200.log" | tail -60;;
    scale-probe)  # the scale grid of a few ops, no checks: time and memory per case at scale
      timeout ${SCALE_TIMEOUT:-300} python3 -m oracle.report --scale --no-checks --ops ${SCALE_OPS:-rms_norm rope swiglu} \
        --dtypes ${SCALE_DTYPES:-bfloat16} --json "$OUT/drift-scale-probe.json" --html /tmp/probe.html 2>&1 \
        | tee "$OUT/report-scale-probe.log" | tail -40;;
    scale-tests)  # the scale grid through pytest, opt-in (--scale), as GPU CI runs it nightly
      CI=true timeout ${TESTS_TIMEOUT:-560} python3 -m pytest -n auto -q -p no:cacheprovider --scale -m scale tests/test_ops.py \
        2>&1 | tee "$OUT/pytest-scale-h200.log" | tail -25;;
    sanitize)  # compute-sanitizer's four tools on every op of the kernels, then on two broken kernels
      (time python3 -m oracle.sanitize --impl kernels) 2>&1 | tee "$OUT/sanitize-kernels-h200.log" | tail -50
      for bug in unmasked_tail_store unmasked_tail_load; do
        python3 -m oracle.sanitize --impl tests.broken_gpu_kernels:$bug --ops swiglu_fg_kernel --tools memcheck
      done 2>&1 | tee "$OUT/sanitize-broken-h200.log" | tail -20;;
    report)
      timeout 400 python3 -m oracle.report --full --json "$OUT/drift-h200.json" --html "$OUT/drift-h200.html" \
        --update-baseline --baseline "$OUT/baseline-cuda-NVIDIA-H200.json" 2>&1 | tee "$OUT/report-h200.log" | tail -30;;
    liger-report)
      timeout 300 python3 -m oracle.report --impl liger --json "$OUT/drift-liger-h200.json" \
        --html "$OUT/drift-liger-h200.html" 2>&1 | tee "$OUT/report-liger-h200.log" | tail -30;;
    bench)
      timeout 560 python3 -m oracle.bench --json "$OUT/bench-h200.json" 2>&1 | tee "$OUT/bench-h200.log" | tail -45;;
    bench-quick)  # bf16 only, no column sweep
      timeout ${BENCH_TIMEOUT:-300} python3 -m oracle.bench --quick --json "$OUT/bench-quick-h200.json" 2>&1 \
        | tee "$OUT/bench-quick-h200.log" | tail -45;;
    pinned)  # the cases the thorough H200 run found (now pinned in specs.py), on the GPU again
      for c in '{"dims":{"cols":1,"lead":[1]},"dtype":"bfloat16","layout":"contiguous","op":"rms_norm","params":{"eps":1e-12,"weight":"same"},"seed":1,"values":"normal","variant":"llama"}' \
               '{"dims":{"cols":2,"lead":[1]},"dtype":"float32","layout":"contiguous","op":"rms_norm","params":{"eps":1e-06,"weight":"same"},"seed":0,"values":"normal","variant":"llama"}'; do
        python3 -m oracle.repro "$c" | head -4
      done 2>&1 | tee "$OUT/pinned-h200.log";;
    thorough-sharded)  # the thorough profile (400 examples a test) under the default (derived) noise model for
      # each of SHARDED_IMPLS in turn, every test split into SHARDS sessions of 400/SHARDS examples under distinct
      # seeds, run side by side with 16/SHARDS workers each: a test's examples run in one process, so unsplit
      # (SHARDS=1) the longest test sets the wall time. Implementations side by side on one GPU ran far slower
      # (32 processes: reports/logs/pytest-thorough-derived-*-side-by-side-cut-at-540s.log). THOROUGH_OPS narrows
      # the ops; EXTRA takes more pytest options (-x); liger's wheel comes from .peers
      shards=${SHARDS:-4}
      for impl in ${SHARDED_IMPLS:-kernels hf compile}; do
        run=(); [[ "$impl" == liger || "$impl" == peers.liger* ]] && run=(liger_peer)
        name=${impl//[^a-zA-Z0-9_-]/-}  # peers.liger.numbers:impl -> a plain file name
        for seed in $(seq 1 $shards); do
          ( HYPOTHESIS_PROFILE=thorough ORACLE_MAX_EXAMPLES=$((400 / shards)) "${run[@]}" timeout -s INT -k 20 ${THOROUGH_TIMEOUT:-240} \
            python3 -m pytest -n $((16 / shards)) -v -p no:cacheprovider --hypothesis-seed=$seed ${EXTRA:-} \
            tests/test_ops.py -k "matches_hf ${THOROUGH_OPS:+and $THOROUGH_OPS}" --impl $impl \
            > "/tmp/thorough-$name-seed$seed.log" 2>&1; echo "thorough $impl seed $seed exit $?" ) &
        done; wait
        for seed in $(seq 1 $shards); do  # one log per implementation (a call brings back 8 files at most)
          echo "##### seed $seed of $shards, $((400 / shards)) examples a test"; cat "/tmp/thorough-$name-seed$seed.log"
        done > "$OUT/pytest-thorough-sharded-$name-h200.log"
        grep -E "^#####|(FAILED|ERROR) | (passed|failed).* in " "$OUT/pytest-thorough-sharded-$name-h200.log" | tail -24
      done;;
    drawn-profile)  # where a thorough example's time goes: hypothesis-drawn cases at the GPU budget through the engine,
      # under the derived and the declared noise model (PROFILE_IMPL, PROFILE_OP, PROFILE_DTYPE, PROFILE_CASES)
      for model in derived declared; do
        ORACLE_NOISE_MODEL=$model timeout ${PROFILE_TIMEOUT:-150} python3 scripts/case_profile.py --sort tottime \
          --top 40 --impl ${PROFILE_IMPL:-hf} --op ${PROFILE_OP:-rms_norm} --dtype ${PROFILE_DTYPE:-float32} \
          --drawn ${PROFILE_CASES:-40}
      done 2>&1 | tee "$OUT/drawn-profile-${PROFILE_IMPL:-hf}-${PROFILE_OP:-rms_norm}-h200.log" \
        | grep -E " cases under ";;
    noise-tables)  # the derived noise model against the hand-written ones: scale ratios and cost, on the GPU
      timeout ${NOISE_TIMEOUT:-300} python3 scripts/derived_noise_tables.py --device cuda --json "$OUT/derived-noise-h200.json" 2>&1 \
        | tee "$OUT/derived-noise-h200.log" | tail -40;;
    declared-liger)  # the declared ops of tests/declared_project against Liger-Kernel's counterparts (carry its wheel)
      (cd tests/declared_project && CI=true timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -n 8 -p no:cacheprovider \
        --pyargs oracle.suite --op-module declared_ops --impl liger_impls:liger \
        --ops layer_norm,fused_add_rms_norm,cross_entropy,softmax 2>&1 | tee "$OUT/pytest-declared-liger-h200.log" | tail -40)
      (cd tests/declared_project && CI=true timeout 200 python3 -m pytest -n 8 -q -p no:cacheprovider --pyargs oracle.suite \
        --op-module declared_ops --impl impls:compiled -k "matches_hf and float32" 2>&1 | tail -5);;
    fast-maths)  # a correct fp32 SwiGLU with tl.exp: the generic suite passes it by default
      CI=true timeout 200 python3 -m pytest -n 8 -q -p no:cacheprovider tests/test_ops.py --ops swiglu \
        --impl tests.fast_maths_impls:triton_fast_exp_swiglu 2>&1 | tee "$OUT/pytest-fast-exp-h200.log" | tail -8;;
    *) echo "unknown step $step"; exit 2;;
  esac
done
