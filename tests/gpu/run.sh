#!/bin/sh
# tests/gpu/run.sh TEST_GPU_BINARY -- what `make test-gpu` runs:
#   1. the device-path test binary (the ASan build of tests/integration/
#      test_gpu.c; its kvpool processes: $KVPOOL_TEST_BIN, default the ASan
#      build) with KVPOOL_GPU_BACKEND=$GPU_BACKEND (default cuda: the real
#      driver; ASan with protect_shadow_gap=0, which the CUDA driver needs, and
#      the driver's own allocations kept out of the leak report: lsan.supp);
#   2. tests/gpu with pytest under $GPU_PY (torch CUDA tensors; each test
#      skips with its reason without torch, CUDA or kvpool._native; kvpool
#      serve: $KVPOOL_BIN, default build/kvpool).
# Prints the total as the last line: N passed, N failed, N skipped. A binary
# that dies without its RESULT line counts as one failure; one that is not
# built, or a Python without pytest, as one skip with the reason.
bin=${1:?usage: tests/gpu/run.sh TEST_GPU_BINARY}
here=$(cd "$(dirname "$0")" && pwd)
backend=${GPU_BACKEND:-cuda}
py=${GPU_PY:-python3}
P=0; F=0; S=0
log=$(mktemp)

echo "== $bin (KVPOOL_GPU_BACKEND=$backend)"
if [ -x "$bin" ]; then
    KVPOOL_BIN=${KVPOOL_TEST_BIN:-build/asan/kvpool} KVPOOL_GPU_BACKEND=$backend \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}protect_shadow_gap=0" \
    LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$here/lsan.supp:print_suppressions=0" \
        "$bin" >"$log" 2>&1
    rc=$?
    cat "$log"
    res=$(grep '^RESULT ' "$log" | tail -1)
    if [ -n "$res" ]; then
        set -- $res
        P=$((P + $2)); F=$((F + $3)); S=$((S + $4))
        [ "$rc" -ne 0 ] && [ "$3" -eq 0 ] && { echo "FAIL $bin: exited $rc after its RESULT line"; F=$((F + 1)); }
    else
        echo "FAIL $bin: exited $rc without a result line"
        F=$((F + 1))
    fi
else
    echo "SKIP $bin: not built (no tests/integration/test_gpu.c in this tree)"
    S=$((S + 1))
fi

echo "== tests/gpu (pytest, $py)"
if "$py" -c 'import pytest' >/dev/null 2>&1; then
    junit=$(mktemp)
    (cd "$here" && "$py" -m pytest -q -p no:cacheprovider -rs --junitxml="$junit" .)
    rc=$?
    counts=$("$py" - "$junit" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
    s = r if r.tag == "testsuite" else r.find("testsuite")
    t, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
    print(t - f - e - k, f + e, k)
except Exception:
    print("0 1 0")
PYEOF
)
    set -- $counts
    [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$2" -eq 0 ] && set -- "$1" 1 "$3" # pytest failed outside a test
    P=$((P + $1)); F=$((F + $2)); S=$((S + $3))
    rm -f "$junit"
else
    echo "SKIP tests/gpu: pytest is not importable by $py"
    S=$((S + 1))
fi
rm -f "$log"
echo "$P passed, $F failed, $S skipped"
[ "$F" -eq 0 ]
