#!/usr/bin/env bash
# The GPU checks in one go, for a machine with a CUDA device and PyTorch, JAX (asdex) and CuPy:
#   bash benchmarks/gpu_run.sh [OUT_DIR]
# runs `pytest -m gpu` (tests/test_gpu.py, tests/test_linalg_device.py and the CUDA cases elsewhere), asd.jax's tests on
# JAX's default device (where JAX is installed) and benchmarks/gpu.py (GPU_BENCH_ARGS: its
# options), writing their logs, a JUnit report and gpu.json into OUT_DIR (default benchmarks/results).
set -u
OUT_DIR=${1:-benchmarks/results}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
nvidia-smi -L
$PY -c "import torch, asd; print('torch', torch.__version__, torch.cuda.get_device_name())"
timeout "${GPU_TEST_TIMEOUT:-240}" $PY -m pytest -m gpu tests -q \
    -p no:cacheprovider --timeout 150 --junitxml "$OUT_DIR/gpu_tests.xml" 2>&1 | tee "$OUT_DIR/gpu_tests.log" | tail -40
if $PY -c "import jax" 2>/dev/null; then
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${GPU_JAX_TIMEOUT:-150}" $PY -m pytest tests/test_jax_operators.py \
        tests/test_jax_detection.py -q -p no:cacheprovider --timeout 120 \
        2>&1 | tee "$OUT_DIR/gpu_jax_tests.log" | tail -15
    $PY -c "import jax; print('jax', jax.__version__, 'default device', jax.devices()[0])" 2>&1 | tail -1 \
        | tee -a "$OUT_DIR/gpu_jax_tests.log"
fi
timeout "${GPU_BENCH_TIMEOUT:-300}" $PY -X faulthandler benchmarks/gpu.py ${GPU_BENCH_ARGS:-} --out "$OUT_DIR/gpu.json" 2>&1 \
    | tee "$OUT_DIR/gpu_bench.log" | grep -v -i warn | tail -14
echo "benchmarks/gpu.py exit status: ${PIPESTATUS[0]}"
