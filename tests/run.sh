#!/bin/sh
# Runs every test binary under $1, then the Python tests (pytest over
# tests/python in the venv of scripts/python-env, tests/vllm in the vLLM
# venv of scripts/vllm-env, then tests/engine in vLLM's CPU build of
# scripts/vllm-cpu-env, then tests/sglang in SGLang's venv of
# scripts/sglang-env), and prints the total of all as the last line:
#   N passed, N failed, N skipped
# A binary that dies without its RESULT line counts as one failure. When the
# venv cannot be made, the Python tests count as one skip, with the reason.
# `tests/run.sh --pytest NAME ENV_SCRIPT` runs only pytest over tests/NAME in
# the venv of scripts/ENV_SCRIPT, with the same accounting and last line.
if [ "${1:-}" = "--pytest" ]; then
    only=${2:?usage: tests/run.sh --pytest NAME ENV_SCRIPT}
    only_env=${3:?usage: tests/run.sh --pytest NAME ENV_SCRIPT}
    dir=
else
    only=
    dir=${1:?usage: tests/run.sh BUILD_TEST_DIR}
fi
P=0; F=0; S=0
log=$(mktemp)
failed=$(mktemp) # names of what failed, repeated above the total (CI shows the tail)
for t in $([ -n "$dir" ] && find "$dir" -type f -name 'test_*' -perm -u+x | sort); do
    echo "== $t"
    "$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    grep '^FAIL ' "$log" | sed "s|^FAIL |FAIL $(basename "$t"): |" >>"$failed"
    res=$(grep '^RESULT ' "$log" | tail -1)
    if [ -n "$res" ]; then
        set -- $res
        P=$((P + $2)); F=$((F + $3)); S=$((S + $4))
    else
        echo "FAIL $t: exited $rc without a result line" | tee -a "$failed"
        F=$((F + 1))
    fi
done

root=$(cd "$(dirname "$0")/.." && pwd)

# pytest_dir NAME ENV_SCRIPT: runs pytest over tests/NAME with the python that
# scripts/ENV_SCRIPT prints, adding its JUnit counts to P F S; a venv that
# cannot be made counts as one skip, with the reason.
pytest_dir() {
    echo "== tests/$1 (pytest)"
    if py=$("$root/scripts/$2" 2>"$log"); then
        junit=$(mktemp)
        rcf=$(mktemp)
        (cd "$root/tests/$1" && "$py" -m pytest -q -p no:cacheprovider -rsfE \
            --junitxml="$junit" .; echo $? >"$rcf") 2>&1 | tee "$log"
        rc=$(cat "$rcf")
        rm -f "$rcf"
        grep -E '^(FAILED|ERROR) ' "$log" | sed "s|^|tests/$1: |" >>"$failed"
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
        [ "$rc" -ne 0 ] && [ "$2" -eq 0 ] && set -- "$1" 1 "$3" # pytest failed outside a test
        P=$((P + $1)); F=$((F + $2)); S=$((S + $3))
        rm -f "$junit"
    else
        echo "SKIP tests/$1: the venv of scripts/$2 could not be made: $(tail -3 "$log" | tr '\n' ' ')"
        S=$((S + 1))
    fi
}

if [ -n "$only" ]; then
    pytest_dir "$only" "$only_env"
else
    # The vLLM venv first: tests/python also uses its torch (test_torch_cpu_tensors),
    # so on a fresh machine it must exist before tests/python runs, not after.
    "$root/scripts/vllm-env" >"$log" 2>&1 || echo "note: the vLLM venv could not be made: $(tail -3 "$log" | tr '\n' ' ')"
    pytest_dir python python-env
    # vLLM's tests exercise the Python connector, not our threads: make tsan leaves them out
    if [ -z "${KVP_TSAN:-}" ]; then
        pytest_dir vllm vllm-env        # vLLM 0.33.0's scheduler, a forward that writes known bytes
        pytest_dir engine vllm-cpu-env  # vLLM 0.32.0's CPU build: its real engine, real forwards
        pytest_dir sglang sglang-env    # SGLang 0.5.23's Mooncake backend and host pools on kvpool
    fi
fi
rm -f "$log"
if [ -s "$failed" ]; then
    echo "== what failed"
    cat "$failed"
fi
rm -f "$failed"
echo "$P passed, $F failed, $S skipped"
[ "$F" -eq 0 ]
