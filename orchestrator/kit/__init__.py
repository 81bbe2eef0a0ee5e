"""orch's in-job kit: what a training program uses to keep orch's promises from the inside.

Part of the ``orchestrator`` distribution and importable on a compute node; nothing here imports the
bundled trainer (``orch_trainer``), which is the kit's first user, never its provider. Modules:

- :mod:`.preemption`: ``PreemptionFlag``, set by SIGTERM/SIGUSR2 and acted on at a safe point; under orch it
  also records every stop in ``attempts/<n>/stop.json`` (``StopRecorder``), whoever sent the signal;
- :mod:`.heartbeat`: ``Heartbeat``, ``attempts/<n>/progress.json`` from a helper thread (``for_rank``: the other
  ranks of a multi-rank job write ``progress.rank-<r>.json``);
- :mod:`.checkpoint`: ``CheckpointManager``, crash-safe save / latest verified / load / prune (torch);
- :mod:`.commit`: commit a framework's own checkpoint files in orch's format (no torch);
- :mod:`.run`: ``Run``, one attempt as the environment describes it: resume point, stop report, the end
  (``record_completion``: ``complete.json`` under orch's wrapper, which marks done after exit 0; else done.json);
- :mod:`.sharded`: ``ShardedCheckpointer``, one verified commit per step when every rank writes (DCP shards,
  per-rank files), resume verified by the ranks in parallel, on any world size;
- :mod:`.trackers`: ``StopTolerance``, a tracker's failure during a stop (W&B's service killed by the same
  signal) is noted in the stop's report and skipped, so the stop reaches its save;
- :mod:`.rng`, :mod:`.dist`: RNG capture/restore, ranks, their agreement on a stop (``StopAgreement``: one
  all-reduce, every N steps at <= 1 % of the step time) and the gradient accumulation that keeps the batch.

The done marker and the failure report are the run-dir protocol's (``orchestrator.protocol``).
"""
