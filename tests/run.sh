#!/bin/sh
# Runs every test binary under $1 and prints the total as the last line:
#   N passed, N failed, N skipped
# A binary that dies without its RESULT line counts as one failure.
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
rm -f "$log"
echo "$P passed, $F failed, $S skipped"
[ "$F" -eq 0 ]
