#!/usr/bin/env bash
# Install everything the tests need (venv, packages, the dev Slurm cluster, a throwaway PostgreSQL
# server) and run them all. Under CI=true a Slurm cluster or PostgreSQL server that cannot be brought
# up fails the run; it never skips. Ends with the reliability table tallied from this very run's JUnit
# report, and the time each part took.
#
# With no arguments the suite runs as three pytest processes at once: tests/slurm (its time goes mostly
# to Slurm's own delays: preemption grace, time limits) with tests/local, integrations + the trainer's
# (real programs end to end, multi-rank ones among them), and the rest. One pytest alone keeps one core busy at best (load ~1.2 on 2 cores): run one after the
# other they took 37 min of CI's 35-minute budget. With arguments, one pytest runs what they select.
#
# --quick: the quick tier (tests marked `quick`: unit, policy and the one local end-to-end run; minutes, see
# CONTRIBUTING.md). It starts no service and needs none; further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=
if [ "${1:-}" = --quick ]; then quick=1; shift; fi
parts=()
t0=$(date +%s); t=$t0
part() { local now; now=$(date +%s); parts+=("$1: $((now - t)) s"); t=$now; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The services' packages (apt) install while pip installs the Python ones: neither needs the other.
svc_pid=
if [ -n "$quick" ]; then
  :  # the quick tier needs no service: its tests are the ones marked as needing none
elif [ "$(id -u)" = 0 ]; then
  ( bash deploy/slurm/cluster.sh up && bash deploy/postgres/pg.sh up >/dev/null \
    && bash deploy/browser/chromium.sh >/dev/null ) >"$tmp/services.log" 2>&1 &
  svc_pid=$!  # pg.sh prints its URL; the tests ask pg.sh for it; chromium.sh: the browser tests' Chromium
elif [ "${CI:-}" = true ]; then
  echo "test: the Slurm tests need root to start the dev cluster" >&2; exit 1
fi
bash scripts/setup.sh --dev
part "set-up (venv, packages; the services start alongside)"
if [ -n "$svc_pid" ]; then
  echo "test: waiting for the dev Slurm cluster and PostgreSQL to be up"
  svc_rc=0; wait "$svc_pid" || svc_rc=$?
  cat "$tmp/services.log"
  [ $svc_rc -eq 0 ] || { echo "test: bringing up Slurm/PostgreSQL failed (exit $svc_rc)" >&2; exit 1; }
  part "services (Slurm, PostgreSQL), after set-up"
fi
.venv/bin/ruff check .
part "ruff"
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider -o junit_family=xunit1)
set +e
if [ -n "$quick" ]; then
  "${pytest[@]}" --durations=10 -m quick "$@"
  rc=$?
  [ $rc -eq 5 ] && { echo "test: pytest collected no quick tests" >&2; exit 1; }
elif [ $# -gt 0 ]; then
  "${pytest[@]}" --durations=25 --junitxml="$tmp/junit.xml" "$@"
  rc=$?
  [ $rc -eq 5 ] && { echo "test: pytest collected no tests" >&2; exit 1; }
else
  # Stream 2 and 3 run in the background, each with its own log and report, printed after stream 1's.
  # Stream 1 is what the others leave out, so a new test folder is never missed.
  # ~Equal shares of the time, by JUnit (CI 71, s): slurm 1160 + bench 246 + policy 188; integrations 1421 + trainer
  # 194; the rest (local 768, adversarial 662, unit 154, reliability 70, packaging 18). Slurm + local was 1928 s.
  # tests/docs (the docs' commands and pictures run for real: a site build, the README's and the guides' commands,
  # ~3 min) joins the slurm stream: with the README's commands in tests/local the main stream took 35:06 (CI 78).
  # tests/policy (~190 s) moved to the integrations stream when tests/slurm gained the multi-node and goodput
  # tests (~4 min).
  # The three multi-rank local files (~4 min: two of them launch torchrun twice or more) run with the slurm stream:
  # the main stream was the longest (CI 82 by JUnit: main 2675 s, integrations 2540, slurm 2311; under load).
  # This stop (JUnit of a clean run, s of test time = the stream's wall time): slurm 1758, integrations 1507, the rest
  # 1365; tests/slurm grew by ~165 s (an array's node killed, a job allowed fewer nodes, a suspect's own retry, the
  # agreement bench) and tests/integrations shrank by ~60 s (the three "preempted twice" tests folded into
  # test_tracker_curves). So tests/bench (133 s) joins the integrations stream, tests/docs (90 s) and the three
  # multi-rank local files (77 s) go back to the main stream: ~1620 / 1580 / 1530 s.
  # CI of stop 58 took 39:22 (JUnit under load, s: the rest 2271, integrations 2239, slurm 1991). tests/slurm's bench
  # quick run lost its node kill (~110 s: the multinode tests kill a node) and tests/policy (161 s) joined it; a
  # clean run then took 36:01 (slurm 1801 + policy 161 + unit 110, integrations 1393 + trainer 256 + bench 253, the
  # rest 1953). tests/unit goes to the integrations stream: ~1960 / 2010 / 1950 s.
  # The tests' `orch` runs are forked from a process that imported orch (tests/orchzygote.py): the CLI runs were ~40 %
  # of the CPU asked for. A clean run (JUnit, s): the rest 1397 (local 743, adversarial 345, docs 197), slurm 1724 +
  # policy 136, integrations 1466 + trainer 235 + bench 196 + unit 110. tests/trainer and tests/policy join the
  # main stream: ~1770 / 1720 / 1770 s.
  side=("tests/slurm" "tests/integrations tests/bench tests/unit")
  ignore=(); pids=()
  for i in "${!side[@]}"; do
    read -ra dirs <<<"${side[$i]}"
    for d in "${dirs[@]}"; do ignore+=("--ignore=$d"); done
    "${pytest[@]}" --durations=10 --junitxml="$tmp/side$i.xml" "${dirs[@]}" >"$tmp/side$i.log" 2>&1 &
    pids+=($!)
    echo "test: ${side[$i]} runs alongside (its report follows)"
  done
  "${pytest[@]}" --durations=15 --junitxml="$tmp/junit.xml" "${ignore[@]}"
  rc=$?
  [ $rc -eq 5 ] && { echo "test: pytest collected no tests" >&2; exit 1; }
  for i in "${!side[@]}"; do
    wait "${pids[$i]}"
    side_rc=$?
    echo "test: ${side[$i]} (run alongside) exited $side_rc:"
    cat "$tmp/side$i.log"
    [ $side_rc -eq 5 ] && { echo "test: ${side[$i]} collected no tests" >&2; exit 1; }
    [ $rc -eq 0 ] && rc=$side_rc
  done
fi
set -e
if [ -n "$quick" ]; then part "pytest (the quick tier)"; else part "pytest (every suite, the bench scripts' --quick runs included)"; fi
if [ $rc -eq 0 ] && [ $# -eq 0 ] && [ -z "$quick" ]; then
  # BENCHMARKS.md's reliability table, counted from this run's report (not from a run of its own).
  .venv/bin/python bench/bench_reliability.py --from-junit "$tmp/junit.xml" --quick || rc=$?
  part "reliability table"
fi
# ORCH_TEST_REPORTS=DIR keeps every stream's JUnit report and log there (`bench_reliability.py --from-junit
# DIR/junit.xml` writes BENCHMARKS.md's table from this run; --durations of every test).
if [ -n "${ORCH_TEST_REPORTS:-}" ]; then mkdir -p "$ORCH_TEST_REPORTS" && cp "$tmp"/*.xml "$tmp"/*.log "$ORCH_TEST_REPORTS"/; fi
echo "test: time by part (total $(( $(date +%s) - t0 )) s):"
printf '  %s\n' "${parts[@]}"
exit $rc
