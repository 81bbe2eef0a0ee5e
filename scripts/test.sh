#!/usr/bin/env bash
# Install everything the tests need (venv, packages, the dev Slurm cluster, a throwaway PostgreSQL
# server) and run them all. Under CI=true a Slurm cluster or PostgreSQL server that cannot be brought
# up fails the run; it never skips. Ends with the reliability table tallied from this very run's JUnit
# report, and the time each part took.
set -euo pipefail
cd "$(dirname "$0")/.."
parts=()
t0=$(date +%s); t=$t0
part() { local now; now=$(date +%s); parts+=("$1: $((now - t)) s"); t=$now; }
bash scripts/setup.sh --dev
part "set-up (venv, packages)"
if [ "$(id -u)" = 0 ]; then
  bash deploy/slurm/cluster.sh up
  bash deploy/postgres/pg.sh up >/dev/null  # prints its URL; the tests ask pg.sh for it
  part "services (Slurm, PostgreSQL)"
elif [ "${CI:-}" = true ]; then
  echo "test: the Slurm tests need root to start the dev cluster" >&2; exit 1
fi
.venv/bin/ruff check .
part "ruff"
junit=$(mktemp --suffix=.xml)
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 --junitxml="$junit" -o junit_family=xunit1 "$@"
rc=$?
set -e
part "pytest (every suite, the bench scripts' --quick runs included)"
[ $rc -eq 5 ] && { echo "test: pytest collected no tests" >&2; exit 1; }
if [ $rc -eq 0 ] && [ $# -eq 0 ]; then
  # BENCHMARKS.md's reliability table, counted from this run's report (not from a run of its own).
  .venv/bin/python bench/bench_reliability.py --from-junit "$junit" --quick || rc=$?
  part "reliability table"
fi
rm -f "$junit"
echo "test: time by part (total $(( $(date +%s) - t0 )) s):"
printf '  %s\n' "${parts[@]}"
exit $rc
