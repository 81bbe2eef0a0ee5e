"""orch's bundled trainer and its reusable pieces.

Public API for any training script (each a few lines to adopt):
- ``trainer.preemption.PreemptionFlag``: SIGTERM/SIGUSR2 set a flag, checked at a safe point.
- ``trainer.checkpoint.CheckpointManager``: crash-safe save (optionally in the background),
  ``latest_verified``, ``load`` (verifies sha256 first), ``prune``.
- ``orchestrator.protocol``: ``write_failure``, ``write_progress``, ``write_done_marker``.

``python -m trainer --help`` documents the bundled trainer (flags, exit codes, fault injection).
"""
