#!/bin/sh
# bench/run.sh BUILD_DIR -- every benchmark; JSON results in bench/results/.
set -eu
build=${1:-build}
out=$(dirname "$0")/results
mkdir -p "$out"
echo "== kvpool bench master (results: $out/master.json)"
"$build/kvpool" bench master --json >"$out/master.json.tmp"
mv "$out/master.json.tmp" "$out/master.json"
echo "== kvpool bench store (results: $out/store.json)"
"$build/kvpool" bench store --json >"$out/store.json.tmp"
mv "$out/store.json.tmp" "$out/store.json"
echo "== kvpool bench connector (results: $out/connector.json)"
"$build/kvpool" bench connector --json >"$out/connector.json.tmp"
mv "$out/connector.json.tmp" "$out/connector.json"
echo "== kvpool bench sim (results: $out/sim.json)"
"$build/kvpool" bench sim --json >"$out/sim.json.tmp"
mv "$out/sim.json.tmp" "$out/sim.json"
