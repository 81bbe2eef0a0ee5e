"""A Slurm node whose Python holds only orch-kit (and the user's torch) runs orch's jobs.

The controller submits from the dev venv; ``ORCH_SLURM_PYTHON`` names the kit's venv (tests/kitvenv.py: orch-kit's
wheel, installed ``--no-index`` into a bare venv, plus the dev venv's torch linked in). The batch script starts the
job wrapper with that Python, the wrapper starts the bundled trainer, and the job ends verified: the job side needs
nothing of the controller's on the node.
"""

from __future__ import annotations

import json

from kitvenv import CONTROLLER_DEPENDENCIES, give_users_torch, kit_venv

from orchestrator import protocol

# The program checks where it runs before it trains: the kit's venv, orchestrator from its wheel, no SQLAlchemy.
PROBE = f"""
import importlib.util, json, os, runpy, sys
import orchestrator
json.dump({{"prefix": sys.prefix, "orchestrator": orchestrator.__file__,
           "controller": [m for m in {CONTROLLER_DEPENDENCIES!r} if importlib.util.find_spec(m)]}},
          open(os.path.join(os.environ["ORCH_RUN_DIR"], "where.json"), "w"))
sys.argv = ["orch_trainer", *sys.argv[1:]]
runpy.run_module("orch_trainer", run_name="__main__", alter_sys=True)
"""


def test_a_node_with_only_orch_kit_and_torch_runs_a_job_to_verified(orch, tmp_path) -> None:
    python = kit_venv(tmp_path / "kit")
    give_users_torch(python, tmp_path / "torch-only")
    orch.env["ORCH_SLURM_PYTHON"] = str(python)
    orch.env.pop("PYTHONPATH", None)  # the node's Python finds orchestrator in its own venv, nowhere else
    p = orch("submit", "--backend", "slurm", "--name", "kitonly", "--cpus-per-task", "1", "--",
             str(python), "-c", PROBE, "--preset", "tiny", "--threads", "1", "--max-steps", "8",
             "--save-interval", "4", "--log-interval", "100")
    assert p.returncode == 0, p.stdout + p.stderr
    state = orch.wait("kitonly", {"done_marker_verified", "failed", "retryable_failed"}, timeout=300)
    if state != "done_marker_verified":
        orch("cancel", "kitonly")  # no retry left running on the cluster
    assert state == "done_marker_verified", orch.show("kitonly")
    run_dir = orch.runs / "kitonly"
    batch = protocol.attempt_dir(run_dir, 1) / protocol.SLURM_DIR / protocol.SLURM_SCRIPT
    assert batch.read_text().startswith(f"#!{python}\n")  # the wrapper ran under the kit's Python
    where = json.loads((run_dir / "where.json").read_text())
    assert where["prefix"] == str(python.parent.parent)
    assert where["orchestrator"].startswith(where["prefix"] + "/lib/") and where["controller"] == []
