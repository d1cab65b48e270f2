#!/bin/sh
# tests/cuda_mock.sh TEST_GPU [MOCK_DIR]: the real CUDA backend (gpu_cuda.c)
# on the stand-in driver (tests/support/cuda_mock/libcuda_mock.c, built as
# MOCK_DIR/libcuda.so.1, default build/cuda-mock): TEST_GPU (test_gpu of the
# ASan build) runs with KVPOOL_GPU_BACKEND=cuda once per copy mode:
#   batch, kernel, each    KVPOOL_GPU_COPY=<mode>
#   no-batch               KVPOOL_GPU_COPY=auto, KVP_CUDA_MOCK_NO_BATCH=1 (the
#                          driver refuses batches: the backend falls back to
#                          the kernel, or to one copy per piece)
#   driver-12.8            KVPOOL_GPU_COPY=auto on MOCK_DIR-12.8 (cuMemcpyBatchAsync
#                          of CUDA 12.8, with failIdx), when that is built
# then MOCK_DIR/test_multi_device (tests/support/cuda_mock/test_multi_device.c:
# two devices in one process) in the modes batch, kernel and each,
# and, with KVP_CUDA_MOCK_EXTRA=1, also no-kernel (the PTX does not load) and
# launch-fail (launches refused). Each run's output is printed; the mock's
# counters (KVP_CUDA_MOCK_STATS) must show the mode really ran, no host side
# left pageable and no stream fault. Last line: "RESULT passed failed skipped"
# over all runs (a failed counter check is one more failure), as tests/run.sh
# reads it; exit status 1 when anything failed.
bin=${1:?usage: tests/cuda_mock.sh TEST_GPU [MOCK_DIR]}
mock=${2:-build/cuda-mock}
P=0; F=0; S=0
log=$(mktemp); stats=$(mktemp)

# sum KEY: the total of KEY=N over the stats lines of the last run
sum() {
    awk -v k="$1" '{for (i = 1; i <= NF; i++) { split($i, a, "="); if (a[1] == k) s += a[2] }}
                   END {print s + 0}' "$stats"
}

# totals: every counter summed over the processes of the last run
totals() {
    awk '{for (i = 2; i <= NF; i++) {
              split($i, a, "="); if (!(a[1] in s)) o[n++] = a[1]; s[a[1]] += a[2] }}
         END {for (i = 0; i < n; i++) printf "%s%s=%d", i ? " " : "", o[i], s[o[i]]; print ""}' \
        "$stats"
}

# bad NAME WHAT: a failed counter check, counted as one failure
bad() {
    echo "FAIL cuda-mock $1: $2 (mock counters, all processes: $(totals))"
    F=$((F + 1))
}

# run NAME LIBDIR ENV...: one run of the test binary
run() {
    name=$1; dir=$2; shift 2
    echo "== cuda-mock $name: $* (libcuda.so.1 of $dir)"
    if [ ! -e "$dir/libcuda.so.1" ]; then
        echo "FAIL cuda-mock $name: $dir/libcuda.so.1 is not built"
        F=$((F + 1))
        return
    fi
    : >"$stats"
    # the tests of the fake device's fault injection are the fake's alone
    env LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KVPOOL_GPU_BACKEND=cuda \
        KVP_CUDA_MOCK_STATS="$stats" "$@" "$bin" -device_faults_fail_that_key_only \
        -segment_that_cannot_be_pinned_still_works >"$log" 2>&1
    rc=$?
    cat "$log"
    echo "cuda-mock $name counters: $(totals)"
    res=$(grep '^RESULT ' "$log" | tail -1)
    if [ -n "$res" ]; then
        set -- $res
        P=$((P + $2)); F=$((F + $3)); S=$((S + $4))
    else
        echo "FAIL cuda-mock $name: exited $rc without a result line"
        F=$((F + 1))
    fi
    # the backend was the driver (the mock), not a skip for want of one
    [ -s "$stats" ] || bad "$name" "libcuda.so.1 was never initialised"
    grep -q 'skip reason: no device' "$log" && bad "$name" "tests skipped for want of a device"
    [ "$(sum faults)" -eq 0 ] || bad "$name" "a stream faulted"
    [ "$(sum pageable)" -eq 0 ] || bad "$name" "async copies from memory that was not page-locked"
    b=$(sum batch_calls); k=$(sum launches); e=$(sum async_copies)
    case $name in
    batch | driver-12.8)
        [ "$b" -gt 0 ] && [ "$k" -eq 0 ] ||
            bad "$name" "no cuMemcpyBatchAsync call was made (or kernels were launched)" ;;
    kernel)
        [ "$k" -gt 0 ] && [ "$b" -eq 0 ] ||
            bad "$name" "no kernel was launched (or batch calls were made)" ;;
    each | no-kernel)
        [ "$e" -gt 0 ] && [ "$b" -eq 0 ] && [ "$k" -eq 0 ] ||
            bad "$name" "batch calls or launches were made, or no async copy" ;;
    no-batch)
        [ "$(sum batch_refused)" -gt 0 ] && [ "$b" -eq 0 ] && [ "$((e + k))" -gt 0 ] ||
            bad "$name" "the refused batches did not fall back to the kernel or async copies"
        grep -q 'cuMemcpyBatchAsync refused; copies go' "$log" ||
            bad "$name" "no warning that the copy mode changed" ;;
    launch-fail)
        [ "$(sum launch_refused)" -gt 0 ] && [ "$e" -gt 0 ] ||
            bad "$name" "the refused launches did not fall back to async copies" ;;
    esac
}

# multi MODE: MOCK_DIR/test_multi_device (two devices in one process), when built
multi() {
    t=$mock/test_multi_device
    [ -x "$t" ] || return 0
    echo "== cuda-mock multi-device $1: KVP_CUDA_MOCK_DEVICES=2 KVPOOL_GPU_COPY=$1"
    env LD_LIBRARY_PATH="$mock${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KVPOOL_GPU_BACKEND=cuda \
        KVP_CUDA_MOCK_DEVICES=2 KVPOOL_GPU_COPY="$1" "$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    res=$(grep '^RESULT ' "$log" | tail -1)
    if [ -n "$res" ]; then
        set -- $res
        P=$((P + $2)); F=$((F + $3)); S=$((S + $4))
    else
        echo "FAIL cuda-mock multi-device: exited $rc without a result line"
        F=$((F + 1))
    fi
}

run batch "$mock" KVPOOL_GPU_COPY=batch
run kernel "$mock" KVPOOL_GPU_COPY=kernel
run each "$mock" KVPOOL_GPU_COPY=each
run no-batch "$mock" KVPOOL_GPU_COPY=auto KVP_CUDA_MOCK_NO_BATCH=1
[ -e "$mock-12.8/libcuda.so.1" ] && run driver-12.8 "$mock-12.8" KVPOOL_GPU_COPY=auto
for m in batch kernel each; do multi $m; done
if [ "${KVP_CUDA_MOCK_EXTRA:-}" = 1 ]; then
    run no-kernel "$mock" KVPOOL_GPU_COPY=kernel KVP_CUDA_MOCK_NO_KERNEL=1
    run launch-fail "$mock" KVPOOL_GPU_COPY=kernel KVP_CUDA_MOCK_LAUNCH_FAIL=1
fi
rm -f "$log" "$stats"
echo "RESULT $P $F $S"
[ "$F" -eq 0 ]
