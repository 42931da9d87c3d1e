#!/usr/bin/env bash
# `make test`: the tests and CI's validation (ci/validate.sh), then the total and every part.
# - pytest in three parts (tests/conftest.py PARTS): the single-process tests three at a time (--part shared: many of
#   them wait part of the time on a server, a browser or a Flower timeout; two at a time their own CPU-seconds were
#   322-342 of the part's 2 x 260), then the tests that hold both CPUs (--part ranks, two workers), so no test waits
#   with a CPU idle for the other worker's test to end;
#   and, beside both in the background, the single-process tests that only compute (--part beside: builds, rebuilds,
#   training runs). All share one prepared-data cache and one folder of what tests make once; the quick entries'
#   builds (both CPUs) and every dataset are made first (tests/helpers.py made_first), so no worker waits for them.
# - The beside part and validation run in the background, each in a process group of its own, their output in
#   build/test-beside.log and build/validation/validation.log, printed when they end. The other parts leave a CPU idle
#   for seconds at a time (a rank 0 exporting while the others wait, a server waiting out a timeout, the test's own
#   checks, a worker's last file): background work fills those gaps instead of running alone afterwards. The beside
#   part at niceness 19 (the kernel's weight 15 against a test's 1,024: a CPU the other parts leave, hardly a share of
#   one they want), validation at idle priority (SCHED_IDLE, weight 3: what both leave), so the tests end first.
#   Both idle, they shared the gaps evenly and the beside part ended 87-113 s after the others (2026-12-07).
# Exit status: non-zero when any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
# each part names its own number of pytest-xdist workers (-n)
PYTEST=("$BIN/python" -m pytest -q -ra --dist loadfile --no-loadscope-reorder)
LOG=build/validation/validation.log
BESIDE_LOG=build/test-beside.log

# The CPUs' busy and idle time (/proc/stat's first line, in clock ticks): read at the start and the end, so the last
# line says how busy both CPUs were and how many CPU-seconds the run's processes took: a run whose CPUs were busy
# throughout is bound by its CPU-seconds (fewer of them, not better scheduling, shortens it). The machine's busy time
# also counts what the kernel and processes left to init (a server a test stopped by signal, say) spent.
cpu_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8, $5 + $6; exit}' /proc/stat; }
read -r busy_start idle_start < <(cpu_ticks)
start=$(date +%s)
shared_dir=$(mktemp -d -t zoo-test-XXXXXX)
validation_pid="" beside_pid=""
stop_idle_parts() {
  # their whole process groups: zoo validate's or pytest's workers and any build's torchrun and ranks
  for pid in $validation_pid $beside_pid; do kill -- -"$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  rm -rf "$shared_dir"
}
trap stop_idle_parts EXIT
trap 'exit 130' INT TERM
export ZOO_DATA_DIR=$shared_dir/data ZOO_TEST_SHARED=$shared_dir/made-once
mkdir -p "$ZOO_DATA_DIR" "$ZOO_TEST_SHARED" "$(dirname "$LOG")"

"$BIN/python" -m tests.helpers
shared=$?
made=$(date +%s)
echo "the beside tests and validation: running in the background (pytest --part beside at niceness 19," \
  "ci/validate.sh at idle priority; their output: $BESIDE_LOG, $LOG, printed when they end)"
# Each in a process group of its own (pgid = its pid) in this session: in a new session (setsid) it would get an
# autogroup of its own, which the kernel gives as much CPU as the tests' session, whatever its priority. The beside
# part's timeout per test is longer: in the background a test may wait minutes for a CPU (the timeout catches hangs).
set -m
chrt --idle 0 bash ci/validate.sh > "$LOG" 2>&1 &  # chrt: util-linux, in every Debian and Ubuntu base system
validation_pid=$!
if [ "$shared" -eq 0 ]; then
  nice -n 19 "${PYTEST[@]}" -n 2 --durations=10 --timeout 2700 --part beside > "$BESIDE_LOG" 2>&1 &
  beside_pid=$!
fi
set +m
if [ "$shared" -eq 0 ]; then "${PYTEST[@]}" -n 3 --durations=25 --part shared; shared=$?; fi
half=$(date +%s)
"${PYTEST[@]}" -n 2 --durations=15 --part ranks
ranks=$?
mid=$(date +%s)
beside=1
if [ -n "$beside_pid" ]; then wait "$beside_pid"; beside=$?; beside_pid=""; cat "$BESIDE_LOG"; fi
beside_end=$(date +%s)
wait "$validation_pid"
validation=$?
validation_pid=""
end=$(date +%s)
read -r busy_end idle_end < <(cpu_ticks)
cat "$LOG"
# this shell's waited children, their own waited children included: bash's `times` (in this shell, not a subshell,
# whose counts start at zero), its second line: user and system time
{ times; } > "$shared_dir/times"
cpu_seconds=$(awk 'NR == 2 {for (i = 1; i <= 2; i++) {split($i, t, /[ms]/); s += t[1] * 60 + t[2]}}
                   END {printf "%d", s}' "$shared_dir/times")
busy=$((busy_end - busy_start)) idle=$((idle_end - idle_start))
echo "make test: $((end - start)) s wall (the first $((made - start)) s the quick entries' builds; pytest" \
  "$((half - made)) s single-process tests, exit $shared, then $((mid - half)) s tests that hold both CPUs, exit" \
  "$ranks; beside them in the background: the beside tests (their own time on their last line above), their last" \
  "$((beside_end - mid)) s after the others, exit $beside; validation, its last $((end - beside_end)) s after the" \
  "tests, exit $validation)"
echo "make test: $cpu_seconds CPU-seconds (user and system time of the processes it started, as their parents" \
  "waited for them); the machine's CPUs $((100 * busy / (busy + idle > 0 ? busy + idle : 1)))% busy over the run," \
  "$(((idle + 50) / $(getconf CLK_TCK))) CPU-seconds idle"
[ "$shared" -eq 0 ] && [ "$ranks" -eq 0 ] && [ "$beside" -eq 0 ] && [ "$validation" -eq 0 ]
