#!/bin/sh
# bench/run.sh BUILD_DIR -- every benchmark; JSON results in bench/results/.
set -eu
build=${1:-build}
out=$(dirname "$0")/results
mkdir -p "$out"
echo "== kvpool bench master (results: $out/master.json)"
"$build/kvpool" bench master --json >"$out/master.json.tmp"
mv "$out/master.json.tmp" "$out/master.json"
echo "== kvpool bench scrape: the master's key-ops/s while /metrics is scraped (results: $out/scrape.json)"
"$build/kvpool" bench scrape --json >"$out/scrape.json.tmp"
mv "$out/scrape.json.tmp" "$out/scrape.json"
echo "== kvpool bench kvev: the master with KV events on vs off, lookup_hashes vs EXIST (results: $out/kvev.json)"
"$build/kvpool" bench kvev --json >"$out/kvev.json.tmp"
mv "$out/kvev.json.tmp" "$out/kvev.json"
echo "== kvpool bench store (results: $out/store.json)"
"$build/kvpool" bench store --json >"$out/store.json.tmp"
mv "$out/store.json.tmp" "$out/store.json"
# KVPOOL_BENCH_SEGMENT: the flags of bench segment (default --size 4GiB; the
# README's table: --size 4GiB,16GiB --hugetlb, as root, which reserves 2 MiB
# pages for those rounds and gives them back)
echo "== kvpool bench segment: a fresh serve's ready time, shm attach, puts during the prefault (results: $out/segment.json)"
# shellcheck disable=SC2086
"$build/kvpool" bench segment ${KVPOOL_BENCH_SEGMENT:---size 4GiB} --json >"$out/segment.json.tmp"
mv "$out/segment.json.tmp" "$out/segment.json"
echo "== kvpool bench connector (results: $out/connector.json)"
"$build/kvpool" bench connector --json >"$out/connector.json.tmp"
mv "$out/connector.json.tmp" "$out/connector.json"
echo "== kvpool bench sim (results: $out/sim.json)"
"$build/kvpool" bench sim --json >"$out/sim.json.tmp"
mv "$out/sim.json.tmp" "$out/sim.json"
echo "== kvpool bench sim --tier: DRAM only vs DRAM + SSD (results: $out/sim_tier.json)"
"$build/kvpool" bench sim --tier --json >"$out/sim_tier.json.tmp"
mv "$out/sim_tier.json.tmp" "$out/sim_tier.json"
echo "== kvpool bench sim --churn: load failures per 1,000 hits, EXIST vs EXIST_LEASE (results: $out/sim_churn.json)"
"$build/kvpool" bench sim --churn --json >"$out/sim_churn.json.tmp"
mv "$out/sim_churn.json.tmp" "$out/sim_churn.json"
echo "== kvpool bench disk: the SSD tier's store vs fio (results: $out/disk.json)"
"$build/kvpool" bench disk --json >"$out/disk.json.tmp"
mv "$out/disk.json.tmp" "$out/disk.json"
echo "== kvpool bench ha: leader + standby vs one master, kill -9 failovers (results: $out/ha.json)"
"$build/kvpool" bench ha --json >"$out/ha.json.tmp"
mv "$out/ha.json.tmp" "$out/ha.json"
venv=${KVPOOL_VENV:-$HOME/.cache/kvpool/venv}
if "$venv/bin/python" -c 'import numpy' 2>/dev/null; then
  echo "== bench/bench_python.py: kvpool.mooncake, the C client, Mooncake (results: $out/python.json)"
  log=$(mktemp)  # kvpool._native for that Python; its output shown only if the build fails
  if ! (cd "$(dirname "$0")/.." &&
        "$venv/bin/python" setup.py -q build_ext --inplace) >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
  "$venv/bin/python" "$(dirname "$0")/bench_python.py" --kvpool "$build/kvpool" \
    --out "$out/python.json.tmp"
  mv "$out/python.json.tmp" "$out/python.json"
else
  echo "== bench/bench_python.py skipped: no Python with numpy at $venv/bin/python (set KVPOOL_VENV)"
fi
# time to first token in vLLM's real CPU engine (its venv: scripts/vllm-cpu-env)
if vc=$("$(dirname "$0")/../scripts/vllm-cpu-env" 2>/dev/null); then
  echo "== bench/ttft.py: vLLM's CPU engine, TTFT without a connector, pool miss, pool hit, vLLM's prefix cache (results: $out/ttft.json)"
  # kvpool._native: built in python/kvpool by bench_python.py's step above (same interpreter)
  "$vc" "$(dirname "$0")/ttft.py" --kvpool "$build/kvpool" --json "$out/ttft.json.tmp"
  mv "$out/ttft.json.tmp" "$out/ttft.json"
else
  echo "== bench/ttft.py skipped: scripts/vllm-cpu-env could not make vLLM's CPU venv"
fi
vv=${KVPOOL_VLLM_VENV:-$HOME/.cache/kvpool/venv-vllm}; if [ -x "$vv/bin/python" ] && "$vv/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("vllm") is None)' 2>/dev/null; then echo "== bench/bench_vllm.py: vLLM 0.33 scheduler, no connector / kvpool / in-tree Mooncake connector on Mooncake and on kvpool (results: $out/vllm.json)"; "$vv/bin/python" "$(dirname "$0")/bench_vllm.py" --kvpool "$build/kvpool" --out "$out/vllm.json"; else echo "== bench/bench_vllm.py skipped: no vLLM venv at $vv (set KVPOOL_VLLM_VENV)"; fi
# kvpool as a tier of vLLM's native offloading: store/load GB/s through vLLM's
# TieringOffloadingManager against `kvpool bench store` of the same sizes
if [ -x "$vv/bin/python" ] && "$vv/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("vllm") is None)' 2>/dev/null; then
  echo "== bench/vllm_tier.py: kvpool as a secondary tier of vLLM 0.33's offloading vs kvpool bench store (results: $out/vllm_tier.json)"
  "$vv/bin/python" "$(dirname "$0")/vllm_tier.py" --kvpool "$build/kvpool" --out "$out/vllm_tier.json" >/dev/null
else
  echo "== bench/vllm_tier.py skipped: no vLLM venv at $vv (set KVPOOL_VLLM_VENV)"
fi
# The hostile run (bench/hostile.py, about 4 minutes) only when asked for:
# KVPOOL_BENCH_HOSTILE=1 (KVPOOL_HOSTILE_SECONDS per target, default 60).
if [ "${KVPOOL_BENCH_HOSTILE:-0}" = 1 ]; then
  echo "== bench/hostile.py: master, node and lookup socket under attack (results: $out/hostile.json)"
  "$venv/bin/python" "$(dirname "$0")/hostile.py" --kvpool "$build/kvpool" \
    --seconds "${KVPOOL_HOSTILE_SECONDS:-60}" --out "$out/hostile.json"
else
  echo "== bench/hostile.py skipped (KVPOOL_BENCH_HOSTILE=1 to run it, or make bench-hostile)"
fi
