#!/usr/bin/env bash
# Install everything the tests need (venv, packages, the dev Slurm cluster, a throwaway PostgreSQL
# server) and run them all. Under CI=true a Slurm cluster or PostgreSQL server that cannot be brought
# up fails the run; it never skips. Ends with the reliability table tallied from this very run's JUnit
# report, and the time each part took.
#
# With no arguments the suite runs as two pytest processes at once: tests/slurm, whose time goes mostly
# to Slurm's own delays (preemption grace, time limits, the controller's polls), alongside everything
# else, which keeps both cores busy. Run one after the other they took 12 + 25 min; the CI budget is 35
# for the whole script. With arguments, one pytest runs exactly what they select.
set -euo pipefail
cd "$(dirname "$0")/.."
parts=()
t0=$(date +%s); t=$t0
part() { local now; now=$(date +%s); parts+=("$1: $((now - t)) s"); t=$now; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The services' packages (apt) install while pip installs the Python ones: neither needs the other.
svc_pid=
if [ "$(id -u)" = 0 ]; then
  ( bash deploy/slurm/cluster.sh up && bash deploy/postgres/pg.sh up >/dev/null ) >"$tmp/services.log" 2>&1 &
  svc_pid=$!  # pg.sh prints its URL; the tests ask pg.sh for it
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
if [ $# -gt 0 ]; then
  "${pytest[@]}" --durations=25 --junitxml="$tmp/junit.xml" "$@"
  rc=$?
  [ $rc -eq 5 ] && { echo "test: pytest collected no tests" >&2; exit 1; }
else
  "${pytest[@]}" --durations=10 --junitxml="$tmp/slurm.xml" tests/slurm >"$tmp/slurm.log" 2>&1 &
  slurm_pid=$!
  echo "test: tests/slurm runs alongside (its report follows this stream's)"
  "${pytest[@]}" --durations=25 --junitxml="$tmp/junit.xml" --ignore=tests/slurm
  rc=$?
  wait "$slurm_pid"
  slurm_rc=$?
  echo "test: tests/slurm (run alongside) exited $slurm_rc:"
  cat "$tmp/slurm.log"
  if [ $rc -eq 5 ] || [ $slurm_rc -eq 5 ]; then echo "test: a pytest stream collected no tests" >&2; exit 1; fi
  [ $rc -eq 0 ] && rc=$slurm_rc
fi
set -e
part "pytest (every suite, the bench scripts' --quick runs included)"
if [ $rc -eq 0 ] && [ $# -eq 0 ]; then
  # BENCHMARKS.md's reliability table, counted from this run's report (not from a run of its own).
  .venv/bin/python bench/bench_reliability.py --from-junit "$tmp/junit.xml" --quick || rc=$?
  # ORCH_TEST_JUNIT=FILE keeps the report: `bench_reliability.py --from-junit FILE` writes BENCHMARKS.md from it.
  [ -n "${ORCH_TEST_JUNIT:-}" ] && cp "$tmp/junit.xml" "$ORCH_TEST_JUNIT"
  part "reliability table"
fi
echo "test: time by part (total $(( $(date +%s) - t0 )) s):"
printf '  %s\n' "${parts[@]}"
exit $rc
