"""One attempt of one run, as the job's environment describes it: where it lives, what to resume, how it ends.

Framework-free (stdlib + ``orchestrator.protocol``), so the Lightning and Hugging Face callbacks, the
plain-loop context manager and the submitit runner behave alike: resume only from a checkpoint whose
manifest verifies; a stop after a signal is reported with :meth:`Run.preempted` (``failure.json`` class
``preempted``, exit 143) and never writes ``done.json``; a normal end writes ``result/`` and then, through
:func:`record_completion`, either the completion record (under orch's wrapper, which writes the marker
only after the program exits 0) or the marker itself (a script run by hand) (:meth:`Run.finish`).

Who may call: every rank may construct a :class:`Run`; only ``is_writer`` (global rank 0) writes.
"""

from __future__ import annotations

import json
import os
import signal
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.kit.dist import global_rank, lost_peer
from orchestrator.kit.heartbeat import DEFAULT_HEARTBEAT_S, ENV_HEARTBEAT_S
from orchestrator.kit.log import log
from orchestrator.kit.tbpurge import write_purge


class RunDirError(ValueError):
    """No usable run dir: neither ``ORCH_RUN_DIR`` nor a ``run_dir`` argument, or an unsafe one."""


@dataclass
class Run:
    """One attempt of one run, as the job's environment describes it (or a ``run_dir`` without orch)."""

    run_dir: Path
    job: str
    attempt: int
    overrides: dict[str, Any] = field(default_factory=dict)
    is_writer: bool = True

    @classmethod
    def from_env(cls, run_dir: str | os.PathLike[str] | None = None) -> Run:
        """``run_dir`` argument > ``$ORCH_RUN_DIR``; attempt from ``$ORCH_ATTEMPT`` (1 without orch)."""
        raw = run_dir if run_dir is not None else os.environ.get(protocol.ENV_RUN_DIR)
        if not raw:
            raise RunDirError(f"no run dir: run under orch (it sets {protocol.ENV_RUN_DIR}) or pass run_dir=...")
        path = Path(raw).absolute()
        # orch refuses a symlinked run dir (it could point anywhere); so do its integrations.
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise RunDirError(f"run dir {path} is a symlink or not a directory")
        raw_attempt = os.environ.get(protocol.ENV_ATTEMPT, "1")
        if not raw_attempt.isdigit() or int(raw_attempt) < 1:
            raise RunDirError(f"{protocol.ENV_ATTEMPT}={raw_attempt!r}: attempts are numbered from 1")
        try:
            overrides = json.loads(os.environ.get(protocol.ENV_OVERRIDES) or "{}")
        except ValueError:
            overrides = {}
        return cls(run_dir=path, job=os.environ.get(protocol.ENV_JOB_NAME) or path.name, attempt=int(raw_attempt),
                   overrides=overrides if isinstance(overrides, dict) else {}, is_writer=global_rank() == 0)

    # --- paths and ids ----------------------------------------------------------------------------
    @property
    def result_dir(self) -> Path:
        """``<run dir>/result``: the outputs the done marker lists."""
        return self.run_dir / protocol.RESULT_DIR

    @property
    def tensorboard_dir(self) -> Path:
        """One TensorBoard log dir for every attempt: steps continue in it instead of a new version dir."""
        return Path(os.environ.get(protocol.ENV_TENSORBOARD_DIR) or self.run_dir / protocol.TENSORBOARD_DIR)

    @property
    def run_id(self) -> str:
        """The tracker run id orch gives every attempt (``WANDB_RUN_ID`` unless the user set their own)."""
        return (os.environ.get("WANDB_RUN_ID") or os.environ.get(protocol.ENV_RUN_ID)
                or protocol.stable_run_id(self.run_dir, self.job))

    @property
    def heartbeat_s(self) -> float:
        """Seconds between heartbeats: ``ORCH_HEARTBEAT_S`` (default 2, at least 0.05)."""
        try:
            return max(0.05, float(os.environ.get(ENV_HEARTBEAT_S, DEFAULT_HEARTBEAT_S)))
        except ValueError:
            return DEFAULT_HEARTBEAT_S

    # --- the start of an attempt -------------------------------------------------------------------
    def already_complete(self) -> bool:
        """THE completion predicate: a verified run is never trained or touched again (seed 000)."""
        v = protocol.verify_done_marker(self.run_dir)
        if v.verified:
            log(f"already complete: {self.run_dir} (verified done.json); nothing written")
        return v.verified

    def begin(self) -> None:
        """Create the attempt dir; keep (renamed) a failure.json an earlier run of this attempt left.

        A Slurm in-place requeue reruns the same attempt number: its first run's ``preempted`` report
        must not be read as this run's outcome (nor lost).
        """
        if not self.is_writer:
            return
        adir = protocol.attempt_dir(self.run_dir, self.attempt)
        adir.mkdir(parents=True, exist_ok=True)
        stale = protocol.set_aside(adir / protocol.FAILURE_FILE)
        if stale is not None:
            log(f"attempt {self.attempt} restarted in place: previous failure.json kept as {stale.name}")

    def resumed(self, step: int, first_logged_step: int | None = None) -> None:
        """Say where this attempt resumed (0: a fresh start), once its checkpoint was restored: the
        program's own tracker calls from now on read it in ``ORCH_RESUME_STEP``, and TensorBoard drops what an
        earlier attempt logged at ``first_logged_step`` (default ``step + 1``: the first step this attempt logs)
        and later, which this attempt logs again (``tbpurge``)."""
        os.environ[protocol.ENV_RESUME_STEP] = str(int(step))
        if not self.is_writer:
            return
        try:
            write_purge(self.tensorboard_dir, step + 1 if first_logged_step is None else first_logged_step,
                        self.attempt)
        except OSError as e:  # the curve shows the redone steps twice; never worth the run
            log(f"cannot write TensorBoard's purge of the steps after {step}: {e}")

    def resume_checkpoint(self, *, hashes: bool = True) -> tuple[int, Path] | None:
        """(step, dir) to resume from: the policy's ``resume`` override, else the newest verified one.

        ``ORCH_OVERRIDES`` ``{"resume": PATH}`` is a rollback (e.g. after a NaN): the checkpoints after
        it belong to the abandoned timeline and are renamed aside, since their names will be written
        again. A rollback target in this run's checkpoints/ that no longer verifies is set aside too, and
        the next OLDER verified one is used (none: a fresh start). ``{"resume": "none"}`` starts fresh.
        ``hashes=False``: manifests and sizes only (a multi-rank job's ranks then hash the files in parallel).
        """
        wanted = self.overrides.get("resume")
        if wanted == "none":
            self._set_aside_newer_than(-1)
            return None
        if isinstance(wanted, str) and wanted:
            path = Path(wanted) if Path(wanted).is_absolute() else self.run_dir / wanted
            problem = protocol.verify_checkpoint(path, hashes=hashes)
            step = protocol.checkpoint_step(path)
            own = step is not None and path.parent.resolve() == (self.run_dir / protocol.CHECKPOINTS_DIR).resolve()
            if problem is not None and not own:
                # Another run's checkpoint (a fork): not ours to replace or set aside.
                raise RunDirError(f"resume override {wanted}: {problem}")
            if problem is not None:
                # Corrupted after orch's policy verified it (RunDirError failed the attempt, then
                # the job). Never a newer one than asked for: a rollback must not resume past the bad step.
                log(f"resume override {wanted} does not verify ({problem}): set aside; using an older checkpoint")
                self._set_aside(path, "corrupt")
                found = self._newest_verified_before(step or 0, hashes=hashes)
                if found is None:
                    self._set_aside_newer_than(-1)
                    return None
                step, path = found
            step = step or 0
            self._set_aside_newer_than(step)
            return step, path
        for path in protocol.iter_checkpoint_dirs(self.run_dir):
            problem = protocol.verify_checkpoint(path, hashes=hashes)
            if problem is None:
                return protocol.checkpoint_step(path) or 0, path
            log(f"skipping checkpoint that does not verify: {problem}")
        return None

    def _newest_verified_before(self, step: int, *, hashes: bool = True) -> tuple[int, Path] | None:
        """(step, dir) of the newest checkpoint older than ``step`` that verifies; corrupt ones are set aside."""
        for path in protocol.iter_checkpoint_dirs(self.run_dir):
            s = protocol.checkpoint_step(path) or 0
            if s >= step:
                continue
            problem = protocol.verify_checkpoint(path, hashes=hashes)
            if problem is None:
                return s, path
            log(f"skipping checkpoint that does not verify: {problem}")
            self._set_aside(path, "corrupt")
        return None

    def _set_aside(self, path: Path, why: str) -> None:
        """Rename a committed checkpoint to ``<name>.<why>-<hex>`` (the writer only; requeue trashes it later)."""
        if not self.is_writer or not path.is_dir():
            return
        dest = path.with_name(f"{path.name}.{why}-{os.urandom(4).hex()}")
        os.rename(path, dest)
        protocol.fsync_dir(path.parent)
        log(f"{path.name} moved aside to {dest.name}")

    def _set_aside_newer_than(self, step: int) -> None:
        for path in protocol.iter_checkpoint_dirs(self.run_dir):
            if (protocol.checkpoint_step(path) or 0) > step:
                self._set_aside(path, "abandoned")

    # --- the end of an attempt ---------------------------------------------------------------------
    def preempted(self, step: int | None, reason: str, checkpoint: Path | None, note: str = "") -> SystemExit:
        """Report a stop on a signal; return the ``SystemExit(143)`` for the caller to raise. ``note`` ends the
        report's detail (the tracker failures ignored during the stop: ``trackers.StopTolerance.report``).

        Never writes done.json: an attempt that got a termination signal is not a finished run, whatever
        the framework would have exited with (Lightning's own SIGTERM path exits 0).
        """
        if self.is_writer:
            rel = str(checkpoint.relative_to(self.run_dir)) if checkpoint is not None else None
            protocol.write_failure(self.run_dir, self.attempt, "preempted", step,
                                   f"{reason}: checkpoint of step {step} saved, exiting{note}",
                                   checkpoint=rel)
            log(f"preempted ({reason}) at step {step}; checkpoint {rel}; exit {protocol.EXIT_PREEMPTED}")
        return SystemExit(protocol.EXIT_PREEMPTED)

    def crashed(self, step: int | None, exc: BaseException | None, detail: str | None = None, *, rank: int = 0,
                world: int = 1) -> None:
        """Record why this rank's attempt failed, so that the attempt gets the right class. ``detail``: the
        traceback's tail, by default ``exc``'s own (the integrations' one format).

        One process: ``failure.json`` ``crash`` (rank 0). Several ranks: a rank that failed by itself writes
        ``attempts/<n>/failure.rank-<r>.json`` (only rank 0 writes failure.json, and the others' tracebacks
        were lost); a rank whose collective failed because a peer went away reports that peer's crash when
        the peer recorded one, else ``killed`` (a kill -9, a lost node: requeued like a killed attempt, not a
        bug of this program), and a survivor other than rank 0 writes it only when rank 0 has not.
        """
        if detail is None:
            detail = "".join(traceback.format_exception(exc))[-1800:] if exc is not None else ""
        adir = protocol.attempt_dir(self.run_dir, self.attempt)
        if world > 1 and lost_peer(exc):
            peer = _peer_crash(adir, rank)
            cls, why = peer if peer else (
                "killed", f"rank {rank} lost a peer rank in a collective (a rank was killed or stopped answering): "
                          f"{detail[-600:]}")
            if self.is_writer or not (adir / protocol.FAILURE_FILE).exists():
                protocol.write_failure(self.run_dir, self.attempt, cls, step, why)
            return
        # One EIO in a checkpoint write, the previous checkpoint intact, was a counted crash.
        cls = protocol.write_error_class(exc)
        if self.is_writer:
            protocol.write_failure(self.run_dir, self.attempt, cls, step, detail)
        else:
            adir.mkdir(parents=True, exist_ok=True)
            protocol.atomic_write_json(adir / RANK_FAILURE.format(rank), {"class": cls, "step": step,
                                                                          "rank": rank, "detail": detail[-1800:]})

    def finish(self, metrics: dict[str, Any], step: int | None = None) -> dict | None:
        """``result/metrics.json``, then :func:`record_completion` over every file under ``result/``: the LAST
        write of the integration. Under orch, what the script writes into ``result/`` after this is listed
        too (the wrapper lists ``result/`` when the program exits 0)."""
        if not self.is_writer:
            return None
        self.result_dir.mkdir(parents=True, exist_ok=True)
        protocol.atomic_write_json(self.result_dir / "metrics.json", metrics)
        files = sorted(str(p.relative_to(self.run_dir)) for p in self.result_dir.rglob("*")
                       if p.is_file() and not p.is_symlink())
        return record_completion(self.run_dir, self.job, self.attempt, files, step=step)


RANK_FAILURE = protocol.RANK_FAILURE  # a non-writer rank's own failure, beside failure.json


_PEER_CLASSES = frozenset({"crash", "storage", "enospc"})  # what a rank's own record may pass on to the attempt


def _peer_crash(adir: Path, rank: int) -> tuple[str, str] | None:
    """The lowest other rank's own failure record in ``adir``: its class (crash, storage, enospc; anything else is
    crash) and one line of detail, or None."""
    for p in protocol.rank_failures(adir):
        if p.name == RANK_FAILURE.format(rank):
            continue
        try:
            rec = protocol.read_json_bounded(p)
            cls = rec.get("class")
            cls = cls if isinstance(cls, str) and cls in _PEER_CLASSES else "crash"
            return cls, f"{p.name}: {str(rec.get('detail', ''))[-1500:]}"
        except (OSError, ValueError, AttributeError):
            return "crash", f"{p.name} (unreadable)"
    return None


def marker_written_by_wrapper() -> bool:
    """True under orch's job wrapper: it writes done.json once the program has exited 0 (ORCH_MARKER_WRITER)."""
    return os.environ.get(protocol.ENV_MARKER_WRITER) == protocol.MARKER_WRITER_WRAPPER


def record_completion(run_dir: Path, job: str, attempt: int, artifacts: list[str], *, step: int | None = None,
                      outputs: list[str] | None = None) -> dict:
    """THE end of a program that completed training (the integrations' and the bundled trainer's one copy).

    Under orch's wrapper: ``attempts/<n>/complete.json`` {token, step, at, outputs}; the wrapper writes
    done.json over ``result/``, these outputs and ``--outputs`` only if the program then exits 0 unstopped
    (a callback's done.json, written before the script's export raised, verified an exit 1).
    Without orch: done.json over ``artifacts`` at once, as the last write. Returns what was written.
    """
    if marker_written_by_wrapper():
        token = os.environ.get(protocol.ENV_TOKEN, "")
        outs = [f"{protocol.RESULT_DIR}/", *(outputs or []), *artifacts]
        path = protocol.write_completion(run_dir, attempt, token, step, list(dict.fromkeys(outs)))
        log(f"training complete: {path.relative_to(run_dir)} written; orch writes {protocol.DONE_MARKER} "
            "once this program exits 0")
        return protocol.read_json_bounded(path)
    marker = protocol.write_done_marker(run_dir, job, attempt, artifacts)
    log(f"done: {protocol.DONE_MARKER} lists {len(artifacts)} file(s)")
    return marker


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum).name if signum else "stop requested"
