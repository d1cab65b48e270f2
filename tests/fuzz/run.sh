#!/bin/sh
# tests/fuzz/run.sh BUILD_DIR SECONDS -- bounded run of every libFuzzer
# binary BUILD_DIR/fuzz_*.
#
# Each target runs for SECONDS on a scratch corpus (a copy of its committed
# seeds, tests/fuzz/corpus/NAME/) plus the committed seeds themselves; new
# inputs only ever go to the scratch copy (libFuzzer writes to the first
# corpus directory), so the committed corpus is left untouched. Prints one
# line per target; on a failure the scratch directory, with the crashing
# input, is kept and named. Exits non-zero if any target fails.
set -u
dir=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS}
secs=${2:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS}
seeds_root=$(cd "$(dirname "$0")" && pwd)/corpus
fail=0
n=0
for bin in "$dir"/fuzz_*; do
    [ -f "$bin" ] && [ -x "$bin" ] || continue
    n=$((n + 1))
    name=$(basename "$bin")
    seeds="$seeds_root/$name"
    work=$(mktemp -d "${TMPDIR:-/tmp}/kvp-$name.XXXXXX")
    mkdir -p "$work/corpus" "$work/artifacts"
    set --
    if [ -d "$seeds" ]; then
        cp -R "$seeds/." "$work/corpus/"
        set -- "$seeds"
    fi
    "$bin" -max_total_time="$secs" -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="$work/artifacts/" "$work/corpus" "$@" >"$work/log" 2>&1
    rc=$?
    stat() { sed -n "s/^stat::$1: *//p" "$work/log" | tail -1; }
    runs=$(stat number_of_executed_units)
    eps=$(stat average_exec_per_sec)
    rss=$(stat peak_rss_mb)
    units=$(find "$work/corpus" -type f | wc -l)
    if [ "$rc" -eq 0 ] && [ -n "$runs" ]; then
        echo "ok   $name: ${secs}s, $runs runs, $eps exec/s, corpus $units, peak rss ${rss} MB"
        rm -rf "$work"
    else
        echo "FAIL $name: exit $rc; log and crashing input in $work"
        grep -m 3 -E 'ERROR|SUMMARY|runtime error|deadly signal' "$work/log" | sed 's/^/     /'
        fail=1
    fi
done
if [ "$n" -eq 0 ]; then
    echo "FAIL no fuzz_* binaries in $dir"
    exit 1
fi
exit "$fail"
