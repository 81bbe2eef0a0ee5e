"""orch's in-job kit: what a training program uses to keep orch's promises from the inside.

Part of the orch-kit distribution (``packaging/orch-kit``), which a compute node or a training venv installs
without the controller's dependencies; nothing here imports the bundled trainer (``orch_trainer``), which is the
kit's first user, never its provider. Modules:

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

The done marker and the failure report are the run-dir protocol's (``orchestrator.protocol``). The public API is
``__all__``: ``from orchestrator.kit import Run, CheckpointManager``; a name not in it may change.
"""

from __future__ import annotations

import importlib
from typing import Any

# The kit's public API, name -> module: ``from orchestrator.kit import CheckpointManager``. Each is imported when a
# script names it, so importing the kit (the job wrapper does, for the heartbeat) never imports torch.
_PUBLIC = {
    "PreemptionFlag": "preemption", "StopRecorder": "preemption",
    "Heartbeat": "heartbeat",
    "CheckpointManager": "checkpoint", "CheckpointError": "checkpoint", "CheckpointCorrupt": "checkpoint",
    "commit_checkpoint": "commit",
    "Run": "run", "RunDirError": "run",
    "ShardedCheckpointer": "sharded",
    "StopTolerance": "trackers",
    "capture_rng": "rng", "restore_rng": "rng",
    "StopAgreement": "dist", "any_rank": "dist",
    "AutoSaveInterval": "interval",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
