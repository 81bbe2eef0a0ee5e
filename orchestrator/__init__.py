"""orch: a job orchestrator for long training runs on Slurm and preemptible capacity.

The packages say where their code runs and what it may import (tests/unit/test_layers.py holds it):

On the compute node, in the user's training environment (stdlib, torch and the frameworks; never SQLAlchemy,
Alembic, click, rich or controller code):
- ``protocol``: the run-directory protocol, the one thing the job and the controller share (formats, the
  completion predicate);
- ``kit``: the in-job library a training script uses (verified checkpoints, stop on signal, heartbeat);
- ``integrations``: the kit for plain loops, Lightning, Hugging Face and submitit;
- ``jobside``: orch's job wrapper and what runs beside the program (per-rank parent, ballast, memory cgroup, spot
  notices).

On the controller (login node; SQLAlchemy):
- ``core``: the job table, its states and the one place they move, the configuration;
- ``decide``: what orch decides from evidence (failure class, retry plan, hung rank, suspect nodes, MTBF);
- ``ops``: every operation that changes the job table or a run dir (submit, launch, reconcile, requeue, cancel);
- ``views``: what orch shows, read-only (status, show, report, metrics, plot, watch);
- ``backends``: local and Slurm; ``cli``: the ``orch`` command.

The two sides install apart: ``packaging/orch-kit`` (the orch-kit distribution) ships this package's root and the
in-job packages, and the bundled trainer; ``pyproject.toml`` (orch) ships the controller's and depends on orch-kit.

Outside any package, stdlib only and shared by both sides: ``errors``, ``testhooks``, ``filelock``; and
``wrapper``/``rankend``, the entry points under which jobs started by an older orch still run.
"""
