"""Nothing the tests, benches, trackers, docs build or browser tests write in the work tree can be committed
by a blind ``git add -A``: each such path is ignored (.gitignore)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ARTIFACTS = [
    "wandb/run-20261205_000000-abc/files/config.yaml",  # W&B offline runs
    "mlruns/0/meta.yaml", "mlflow.db", "mlartifacts/1/x.bin",  # MLflow's file store, its SQLite store
    "runs/Dec05_12-00-00_host/events.out.tfevents.1.host",  # TensorBoard's SummaryWriter default
    "lightning_logs/version_0/hparams.yaml",  # Lightning's default logger
    "outputs/checkpoint-10/model.safetensors", "checkpoints/last.ckpt",  # HF Trainer, Lightning checkpoints
    "site/index.html", "docs/_build/html/index.html",  # the docs build (MkDocs, Sphinx)
    "screenshots/dashboard.png", "test-reports/junit.xml",  # browser tests, kept test reports
    "bench-trainer-x1/run/ckpt.pt", "bench-multirank-x1/run/ckpt.pt",  # benches that work in the checkout
    ".orch/orch.db", "orch.db", "orch.db-wal",  # an ORCH_HOME or DB pointed at the checkout
    ".venv/bin/python", ".pytest_cache/v", ".hypothesis/examples/x", "tests/unit/__pycache__/x.pyc",
]


def test_every_artifact_path_the_suite_and_users_tools_write_is_ignored():
    p = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *ARTIFACTS], cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    not_ignored = [line.split("\t", 1)[1] for line in p.stdout.splitlines() if line.startswith("::")]
    assert not_ignored == [], f"not in .gitignore: {not_ignored}"


def test_nothing_the_repository_tracks_is_ignored():
    p = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout == "", p.stdout[:2000]
