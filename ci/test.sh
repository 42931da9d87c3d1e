#!/usr/bin/env bash
# `make test`: the tests and CI's validation (ci/validate.sh), then the total and every part.
# - pytest in two parts (tests/conftest.py): the single-process tests two at a time, then the tests that hold both CPUs
#   (-m ranks), so no test waits with a CPU idle for the other worker's test to end. Both parts share one prepared-data
#   cache and one folder of what tests make once; the quick entries' builds (both CPUs) are made first
#   (tests/helpers.py made_first), so no worker waits for them.
# - Validation runs beside the tests at idle priority (SCHED_IDLE: it gets a CPU only when no test process wants it),
#   in a process group of its own, its output in build/validation/validation.log, printed when it ends. The tests
#   that hold both CPUs leave one idle for seconds at a time (a rank 0 exporting while the others wait, a server
#   waiting out a timeout, the test's own checks): validation fills those gaps instead of running alone afterwards.
# Exit status: non-zero when any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PYTEST=("$BIN/python" -m pytest -q -ra -n 2 --dist loadfile --no-loadscope-reorder)
LOG=build/validation/validation.log

start=$(date +%s)
shared_dir=$(mktemp -d -t zoo-test-XXXXXX)
validation_pid=""
stop_validation() {
  # its whole process group: zoo validate's worker processes and any rebuild's torchrun and ranks
  if [ -n "$validation_pid" ]; then kill -- -"$validation_pid" 2>/dev/null; wait "$validation_pid" 2>/dev/null; fi
  rm -rf "$shared_dir"
}
trap stop_validation EXIT
trap 'exit 130' INT TERM
export ZOO_DATA_DIR=$shared_dir/data ZOO_TEST_SHARED=$shared_dir/made-once
mkdir -p "$ZOO_DATA_DIR" "$ZOO_TEST_SHARED" "$(dirname "$LOG")"

"$BIN/python" -m tests.helpers
shared=$?
made=$(date +%s)
echo "validation: running beside the tests at idle priority (ci/validate.sh; its output: $LOG, printed when it ends)"
# A process group of its own (pgid = its pid) in this session: in a new session (setsid) it would get an autogroup of
# its own, which the kernel gives as much CPU as the tests' session, idle priority or not.
set -m
chrt --idle 0 bash ci/validate.sh > "$LOG" 2>&1 &  # chrt: util-linux, in every Debian and Ubuntu base system
validation_pid=$!
set +m
if [ "$shared" -eq 0 ]; then "${PYTEST[@]}" --durations=25 -m "not ranks"; shared=$?; fi
half=$(date +%s)
"${PYTEST[@]}" --durations=15 -m ranks
ranks=$?
mid=$(date +%s)
wait "$validation_pid"
validation=$?
validation_pid=""
end=$(date +%s)
cat "$LOG"
echo "make test: $((end - start)) s wall (pytest $((mid - start)) s: $((half - start)) s single-process tests" \
  "(the first $((made - start)) s the quick entries' builds), exit $shared, then $((mid - half)) s tests that hold" \
  "both CPUs, exit $ranks; validation $((end - made)) s beside them at idle priority, its last $((end - mid)) s" \
  "after the tests, exit $validation)"
[ "$shared" -eq 0 ] && [ "$ranks" -eq 0 ] && [ "$validation" -eq 0 ]
