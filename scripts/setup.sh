#!/usr/bin/env bash
# Create or reuse .venv at the repository root and install orch (and, with --dev, the test tools).
# torch: an existing torch in .venv is kept (GPU users install their CUDA build first); otherwise
# torch==2.13.0 is installed, which on the project's CPU machines resolves to a local CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="[trainer]"  # the bundled trainer; a login node that only runs the CLI installs orch without extras
[ "${1:-}" = "--dev" ] && extras="[trainer,dev]"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing torch==2.13.0 (keep your own build by installing torch into .venv first)"
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
# orch depends on orch-kit (the job side, packaging/orch-kit) at its own version: both come from this checkout.
# (orch-kit installs as a path entry, its source lying outside its pyproject's folder; setuptools warns at length.)
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e packaging/orch-kit -e ".$extras"
# pip byte-compiles what it installs, but not an editable project's own modules; where
# PYTHONDONTWRITEBYTECODE is set (many CI images) every orch command, job wrapper and trainer would
# then compile orch from source at start: ~0.1 s of CPU per process (a reconcile took 0.63 s, 0.52 s compiled).
.venv/bin/python -m compileall -q -j 0 orchestrator orch_trainer trainer >/dev/null
.venv/bin/orch --version
