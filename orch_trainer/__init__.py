"""orch's bundled trainer: a tiny char-level transformer with crash-safe checkpoints, exact resume,
preemption, in-process OOM recovery, NaN detection and fault injection (``python -m orch_trainer --help``).

It is the first user of orch's in-job kit (``orchestrator.kit``: ``PreemptionFlag``, ``Heartbeat``,
``CheckpointManager``) and of the run-dir protocol (``orchestrator.protocol``); it provides nothing to
them. Your own training script uses the kit or the integrations (``orchestrator.integrations``), never
this package.
"""
