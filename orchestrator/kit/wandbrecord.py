"""Which W&B run the program logs to, recorded in ``trackers.json`` so that orch can mark the run's end.

Why: W&B's run state is what the last process reported. A preempted attempt's process ends its run cleanly
(exit code 0: "finished"); a killed one never reports ("crashed"). A job that orch then cancels, or gives up on,
showed "finished" or "crashed" in W&B for good. Only the program knows its run's project, entity, mode and
directory (``wandb.init``'s arguments), so the kit notes them from ``wandb.run`` (the heartbeat thread of the
writing rank asks, until it finds one); ``jobside/trackerfinish.py`` then resumes the run once, when orch decides a
failed or cancelled end, and finishes it with that end's exit code.

Stdlib only: W&B is looked up in ``sys.modules``, never imported.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from orchestrator import protocol


def current_run() -> dict[str, str] | None:
    """The coordinates of the W&B run this process logs to, or None (W&B not imported, no run, or disabled)."""
    wandb = sys.modules.get("wandb")
    run: Any = getattr(wandb, "run", None) if wandb is not None else None
    if run is None:
        return None
    try:
        settings = run.settings
        mode = "offline" if settings.mode in ("offline", "dryrun") else str(settings.mode)
        rec = {"run_id": str(run.id), "project": str(run.project or ""), "entity": str(run.entity or ""),
               "mode": mode, "root_dir": str(settings.root_dir)}
    except Exception:  # a W&B version without these, or a run torn down meanwhile: nothing to record
        return None
    return rec if mode in protocol.WANDB_MODES else None


def note(run_dir: Path, noted: str | None) -> str | None:
    """Record the current W&B run in ``run_dir``'s ``trackers.json`` unless it is ``noted`` (the run id recorded
    last); returns the id recorded. Never raises: a full disk costs the mark, not the training."""
    rec = current_run()
    if rec is None or rec["run_id"] == noted:
        return noted
    try:
        protocol.write_tracker(run_dir, "wandb", rec)
    except OSError:
        return noted
    return rec["run_id"]
