#!/bin/sh
# Runs every test binary under $1, then the Python tests (pytest over
# tests/python in the venv of scripts/python-env), and prints the total of
# both as the last line:
#   N passed, N failed, N skipped
# A binary that dies without its RESULT line counts as one failure. When the
# venv cannot be made, the Python tests count as one skip, with the reason.
dir=${1:?usage: tests/run.sh BUILD_TEST_DIR}
P=0; F=0; S=0
log=$(mktemp)
for t in $(find "$dir" -type f -name 'test_*' -perm -u+x | sort); do
    echo "== $t"
    "$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    res=$(grep '^RESULT ' "$log" | tail -1)
    if [ -n "$res" ]; then
        set -- $res
        P=$((P + $2)); F=$((F + $3)); S=$((S + $4))
    else
        echo "FAIL $t: exited $rc without a result line"
        F=$((F + 1))
    fi
done

echo "== tests/python (pytest)"
root=$(cd "$(dirname "$0")/.." && pwd)
if py=$("$root/scripts/python-env" 2>"$log"); then
    junit=$(mktemp)
    (cd "$root/tests/python" && "$py" -m pytest -q -p no:cacheprovider -rs \
        --junitxml="$junit" .)
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
    [ "$rc" -ne 0 ] && [ "$2" -eq 0 ] && set -- "$1" 1 "$3" # pytest failed outside a test
    P=$((P + $1)); F=$((F + $2)); S=$((S + $3))
    rm -f "$junit"
else
    echo "SKIP tests/python: the Python test venv could not be made: $(tail -3 "$log" | tr '\n' ' ')"
    S=$((S + 1))
fi
rm -f "$log"
echo "$P passed, $F failed, $S skipped"
[ "$F" -eq 0 ]
