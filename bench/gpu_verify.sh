#!/usr/bin/env bash
# `ampfix verify` on a CUDA machine: the speed of the correct training fixtures (float16 autocast
# with an enabled GradScaler, at the fixtures' own sizes and at sizes where tensor cores pay),
# every buggy fixture's verdict, and tests/test_verify.py (run first), in one bounded run.
#
#     OUT=/some/folder bash bench/gpu_verify.sh
#
# Each part has its own time limit, so a slow part leaves the others their time; the logs go to
# $OUT/*.md and the raw JSON documents to $OUT/json.tgz.  If libcst is missing (a machine with
# PyTorch but not ampfix's dependencies), wheels in .whl/ are installed into /tmp/site first.
# Results: bench/RESULTS.md, "On CUDA".
set -u
OUT=${OUT:-bench/.cache/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if ! "$PY" -c "import libcst, click" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# a checkout that was not `pip install`ed runs as it is: ampfix maps rules/ to ampfix.rules itself
STEPS=${STEPS:-200}
REPS=${REPS:-3}
WARMUP=${WARMUP:-20}
XDIST=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 8")
# e.g. LARGE_FIXTURES="mlp.py": only these correct fixtures in that part (SMALL_FIXTURES alike;
# BUG_FIXTURES="buggy_fp16_no_scaler.py ...": only these buggy fixtures)

{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    "$PY" -c "import sys, torch, libcst; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
'libcst', libcst.__version__ if hasattr(libcst, '__version__') else '?')"
    nproc
} 2>&1 | tee "$OUT/env.md"

part() {  # part LIMIT_S NAME COMMAND...: run one part under its limit (0: skip it), log to $OUT/NAME.md
    local limit=$1 name=$2
    shift 2
    [ "$limit" = 0 ] && return
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" 2>&1 | tee "$OUT/$name.md"
    echo "[$name: exit ${PIPESTATUS[0]}, $((SECONDS - t0)) s]" | tee -a "$OUT/$name.md"
}

# TESTS_K: only the tests whose names match (pytest -k), e.g. "cuda" for the ones that use the GPU
part "${TESTS_S:-80}" tests "$PY" -m pytest -q -p no:cacheprovider $XDIST tests/test_verify.py ${TESTS_K:+-k "$TESTS_K"}
part "${LARGE_S:-150}" large "$PY" bench/bench_verify.py --steps "$STEPS" --warmup "$WARMUP" --reps "$REPS" --threads 4 \
    --large --skip-bugs --only-large ${LARGE_FIXTURES:+--fixtures $LARGE_FIXTURES} --out "$OUT/json/large"
part "${BUGS_S:-110}" bugs "$PY" bench/bench_verify.py --steps "$STEPS" --warmup "$WARMUP" --reps 1 --threads 2 \
    --only-bugs --all-bugs --jobs 6 ${BUG_FIXTURES:+--bugs $BUG_FIXTURES} --out "$OUT/json/bugs"
part "${SMALL_S:-90}" small "$PY" bench/bench_verify.py --steps "$STEPS" --warmup "$WARMUP" --reps "$REPS" --threads 4 \
    --skip-bugs ${SMALL_FIXTURES:+--fixtures $SMALL_FIXTURES} --out "$OUT/json/small"
# where verify's AMP run loses its speed on CUDA (bench/gpu_verify_overhead.py), with the SM clock
# sampled every 200 ms beside it (nvidia-smi), off unless OVERHEAD_S is set
if [ "${OVERHEAD_S:-0}" != 0 ]; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,utilization.gpu --format=csv,noheader -lms 200 >"$OUT/clocks.csv" 2>&1 &
    SMI=$!
    part "$OVERHEAD_S" overhead "$PY" bench/gpu_verify_overhead.py ${OVERHEAD_ARGS:-}
    kill $SMI 2>/dev/null
fi
[ -d "$OUT/json" ] && tar czf "$OUT/json.tgz" -C "$OUT" json && rm -rf "$OUT/json"
true
