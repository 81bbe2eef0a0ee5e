"""Which Slurm jobs a run dir's attempts went out as are still live: what ``orch submit`` and the liveness check
ask before they start a job in a run dir that may still have one (never two live runs of one job).

Single jobs are found from ``attempts/<n>/slurm/submitted.json``; array tasks from the batches beside the run dir
(their task tables name their run dirs) and from the batch and index a started task's fence record names. Split
from ``backend.py`` as a mixin of ``SlurmBackend``, whose squeue calls it uses: the files are read here, Slurm
is asked there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator import protocol
from orchestrator.backends.base import Phase
from orchestrator.backends.slurm import states as slurm_states
from orchestrator.backends.slurm.sbatch import ARRAY_TASKS_FILE, SLURM_DIR, job_name_for


def _attempt_records(run_dir: Path) -> tuple[dict[str, str], list[protocol.GroupSlot]]:
    """What a run dir's attempt dirs say they went out as: single jobs (job id -> the token its name carries,
    from ``attempts/<n>/slurm/submitted.json``) and array slots (the batch and index a started task's fence
    record names)."""
    ids: dict[str, str] = {}
    slots: list[protocol.GroupSlot] = []
    root = run_dir / protocol.ATTEMPTS_DIR
    try:
        attempt_dirs = [d for d in root.iterdir() if d.name.isdigit()] if root.is_dir() else []
    except OSError:
        return ids, slots
    for d in attempt_dirs:
        try:
            rec = protocol.read_json_bounded(d / SLURM_DIR / protocol.SLURM_SUBMITTED, limit=1 << 16)
        except (OSError, ValueError):
            rec = None
        if (isinstance(rec, dict) and slurm_states.is_job_id(str(rec.get("job_id", "")))
                and isinstance(rec.get("token"), str)):
            ids[str(rec["job_id"])] = rec.get("batch_token") if isinstance(rec.get("batch_token"), str) \
                else rec["token"]
            continue
        slot = protocol.read_group_slot(d)
        if slot is not None:
            slots.append(slot)
    return ids, slots


def _pointed_live(slots: list[protocol.GroupSlot],
                  live_tasks: Callable[[], dict[str, dict[str, str]] | None]) -> list[str]:
    """The array tasks started attempts' fence records name (batch, index), as the controller lists them: a
    hostile test removed the batch dir of a running task after a lost DB, and a second copy was submitted."""
    if not slots:
        return []
    live = live_tasks()
    if live is None:
        return [f"Slurm array of batch {slots[0].token} (squeue could not be asked)"]
    return [live[x.token][str(x.task)] for x in slots if str(x.task) in live.get(x.token, {})]


class RunDirJobs:
    """``live_in_run_dir(s)`` of ``SlurmBackend``, which asks the controller: ``_squeue`` (these jobs) and
    ``_live_array_tasks`` (every live array task of orch's), both at the command-line boundary (``_run``)."""

    def live_in_run_dir(self, run_dir: Path) -> list[str]:
        return self.live_in_run_dirs([run_dir])[run_dir]

    def live_in_run_dirs(self, run_dirs: Sequence[Path]) -> dict[Path, list[str]]:
        """Slurm jobs each run dir's attempts went out as that the controller still lists as pending or running
        under their ``orch-<token>`` name: a single job's from its ``attempts/<n>/slurm/submitted.json``; an array
        task's from the batches beside the run dir (``<runs root>/.orch-batches``), whose task tables name their
        run dirs (a queued task's run dir holds nothing yet, ``launchprep.BatchRecords``, and a task whose
        launcher stopped right after sbatch left no ``submitted.json``), and from the batch and index a started
        task's fence record names (its batch dir may be gone). One squeue call for all array tasks.

        The records are files a job could rewrite; a forged one can only make ``submit`` refuse.
        """
        out: dict[Path, list[str]] = {}
        asked: list[dict[str, dict[str, str]] | None] = []

        def live_tasks() -> dict[str, dict[str, str]] | None:
            if not asked:
                asked.append(self._live_array_tasks())
            return asked[0]

        by_parent: dict[Path, list[Path]] = {}
        for d in run_dirs:
            singles, slots = _attempt_records(d)  # one listing of attempts/ for both kinds of record
            out[d] = self._singles_live(singles)
            if d.is_dir():
                by_parent.setdefault(d.parent, []).append(d)
                found = _pointed_live(slots, live_tasks)
                out[d] += [f for f in found if f not in out[d]]
        for parent, dirs in by_parent.items():
            for d, found in self._in_live_batches(parent, dirs, live_tasks).items():
                out[d] += [f for f in found if f not in out[d]]
        return out

    def _singles_live(self, ids: dict[str, str]) -> list[str]:
        """The single jobs ``ids`` (job id -> the token its name carries) the controller lists as live."""
        if not ids:
            return []
        live = self._squeue(list(ids))
        if live is None:
            return [f"Slurm job(s) {','.join(ids)} (squeue could not be asked)"]
        return [f"Slurm job {jid} ({st})" for jid, (name, st, _r) in live.items()
                if jid in ids and name == job_name_for(ids[jid])
                and slurm_states.phase_of(st) in (Phase.PENDING, Phase.RUNNING)]

    def _in_live_batches(self, parent: Path, run_dirs: list[Path],
                         live_tasks: Callable[[], dict[str, dict[str, str]] | None]) -> dict[Path, list[str]]:
        """Array tasks of the batches beside ``run_dirs`` that the controller lists as pending or running, where
        the batch's task table names one of them. A live batch whose task table cannot be read is "cannot tell",
        never "none"."""
        out: dict[Path, list[str]] = {d: [] for d in run_dirs}
        root = parent / protocol.BATCHES_DIR
        try:
            if root.is_symlink():
                return out
            tokens = {e.name for e in os.scandir(root) if protocol.is_group_token(e.name)}
        except OSError:
            return out
        if not tokens:
            return out
        live = live_tasks()
        if live is None:
            return {d: [f"Slurm arrays of the batches in {root} (squeue could not be asked)"] for d in run_dirs}
        index = {str(d): d for d in run_dirs}
        for t in tokens & live.keys():
            try:
                tasks = protocol.read_json_bounded(protocol.batch_file(parent, t, ARRAY_TASKS_FILE), limit=256 << 20)
            except (OSError, ValueError) as e:  # UnsafePath is a ValueError
                why = f"batch {t} has live tasks and no readable task table ({str(e)[:100]})"
                return {d: [*out[d], f"Slurm array of {why}"] for d in run_dirs}
            for i, task in (tasks.items() if isinstance(tasks, dict) else ()):
                d = index.get(task.get("run_dir")) if isinstance(task, dict) else None
                if d is not None and i in live[t]:
                    out[d].append(live[t][i])
        return out
