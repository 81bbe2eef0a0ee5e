#!/usr/bin/env bash
# Install everything the tests need (venv, packages, the dev Slurm cluster, a throwaway PostgreSQL
# server) and run them all. Under CI=true a Slurm cluster or PostgreSQL server that cannot be brought
# up fails the run; it never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
if [ "$(id -u)" = 0 ]; then
  bash deploy/slurm/cluster.sh up
  bash deploy/postgres/pg.sh up >/dev/null  # prints its URL; the tests ask pg.sh for it
elif [ "${CI:-}" = true ]; then
  echo "test: the Slurm tests need root to start the dev cluster" >&2; exit 1
fi
.venv/bin/ruff check .
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
[ $rc -eq 5 ] && { echo "test: pytest collected no tests" >&2; exit 1; }
exit $rc
