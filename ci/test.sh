#!/usr/bin/env bash
# `make test`: the tests and CI's validation (ci/validate.sh), then the total and every part.
# - pytest in three parts (tests/conftest.py PARTS): the single-process tests three at a time (--part shared: many of
#   them wait part of the time on a server, a browser or a Flower timeout; two at a time their own CPU-seconds were
#   322-342 of the part's 2 x 260), then the tests that hold both CPUs (--part ranks, two workers), so no test waits
#   with a CPU idle for the other worker's test to end;
#   and, beside both in the background, the single-process tests that only compute (--part beside: builds, rebuilds,
#   training runs). All share one prepared-data cache and one folder of what tests make once; the quick entries'
#   builds (both CPUs) and every dataset are made first (tests/helpers.py made_first), so no worker waits for them.
# - The beside part and validation run in the background, one after the other, each in a session of its own, their
#   output in build/test-beside.log and build/validation/validation.log, printed when they end. The other parts leave a
#   CPU idle for seconds at a time (a rank 0 exporting while the others wait, a server waiting out a timeout, the
#   test's own checks, a worker's last file): background work fills those gaps instead of running alone afterwards.
#   Both at idle priority (SCHED_IDLE: a test's process that wakes takes the CPU at once), each session's scheduling
#   group at the lowest niceness (weight 15 against a test's 1,024), so the tests end first; validation starts when
#   the beside part ends, so the gaps go to the tests of pytest first.
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
# the machine the times below were measured on: its CPU, the int8 kernels' instructions (zoo.provenance) and the CPUs
# this run may use (not nproc's count, which follows the OMP_NUM_THREADS=1 the Makefile exports)
machine=$("$BIN/python" -c 'import os; from zoo.provenance import cpu_info, cpu_kind
print(f"{cpu_kind(cpu_info())}, {len(os.sched_getaffinity(0))} CPUs")')
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
echo "the beside tests, then validation: running in the background (pytest --part beside, then ci/validate.sh, at" \
  "idle priority in sessions of their own at niceness 19; their output: $BESIDE_LOG, $LOG, printed when they end)"
# Linux's autogroups schedule each session as one group and give every group an equal share of the CPUs, whatever its
# processes' priority; torchrun and horovodrun start each rank in a session of its own. In the tests' own session the
# background parts took that session's share while its pytest workers waited on two ranks: the support matrix's
# DeepSpeed, DDP, FSDP and Horovod tests took 130-138 s beside them against 80-96 s alone, and 104-105 s with each
# part at idle priority in a session of its own at niceness 19 (2026-12-07). A background build's ranks give their
# own sessions the niceness they inherit (zoo.processes keep_background_priority). A part's session leader is its
# process group too (pgid = its pid: stop_idle_parts). The beside part's timeout per test is longer: in the
# background a test may wait minutes for a CPU (the timeout catches hangs).
in_background() {  # in_background LOG COMMAND...: at idle priority, in a session of its own at the lowest niceness
  local log=$1
  shift
  # setsid and chrt: util-linux, in every Debian and Ubuntu base system; no autogroups (no such file): as it is
  setsid bash -c 'echo 19 2> /dev/null > /proc/self/autogroup; exec chrt --idle 0 "$@"' in_background "$@" \
    > "$log" 2>&1 &
}
if [ "$shared" -eq 0 ]; then
  in_background "$BESIDE_LOG" "${PYTEST[@]}" -n 2 --durations=10 --timeout 2700 --part beside
  beside_pid=$!
fi
# validation once the beside part has ended (tail --pid: GNU coreutils; it checks once a second)
in_background "$LOG" bash -c '[ -z "$0" ] || tail --pid="$0" -f /dev/null; exec bash ci/validate.sh' "$beside_pid"
validation_pid=$!
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
echo "make test: $((end - start)) s wall on $machine (the first $((made - start)) s the quick entries' builds; pytest" \
  "$((half - made)) s single-process tests, exit $shared, then $((mid - half)) s tests that hold both CPUs, exit" \
  "$ranks; beside them in the background: the beside tests (their own time on their last line above), their last" \
  "$((beside_end - mid)) s after the others, exit $beside; validation, its last $((end - beside_end)) s after the" \
  "tests, exit $validation)"
echo "make test: $cpu_seconds CPU-seconds (user and system time of the processes it started, as their parents" \
  "waited for them); the machine's CPUs $((100 * busy / (busy + idle > 0 ? busy + idle : 1)))% busy over the run," \
  "$(((idle + 50) / $(getconf CLK_TCK))) CPU-seconds idle"
minutes() { printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); }
echo "make test: pytest $(minutes $((beside_end - start))) (the builds it needs first, then its three parts), then" \
  "validation's last $(minutes $((end - beside_end))); $(minutes $((end - start))) in all"
[ "$shared" -eq 0 ] && [ "$ranks" -eq 0 ] && [ "$beside" -eq 0 ] && [ "$validation" -eq 0 ]
