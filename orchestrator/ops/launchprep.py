"""An attempt's launch, the parts without the job table: its submission spec, its run dir made ready, its
records (stdlib and orch's own file modules only, so that ``orch submit``'s quick path,
``orchestrator/ops/quicksubmit.py``, and ``orchestrator/ops/launch.py`` share them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import protocol, testhooks
from orchestrator.backends.base import SubmissionRefused, SubmitSpec
from orchestrator.core import resumestate
from orchestrator.core.config import Config
from orchestrator.core.resources import resources_dict, resources_of
from orchestrator.core.resumestate import SET_ASIDE_KEY, TRASHED_KEY
from orchestrator.core.rundir import check_run_dir
from orchestrator.core.states import STOP_GRACE_S
from orchestrator.jobside.ballast import allocate as allocate_ballast
from orchestrator.jobside.ballast import reserve_pool
from orchestrator.ops.trash import empty_trash, leftovers_why, move_to_trash
from orchestrator.protocol import ENV_SWEEP, ENV_SWEEP_PARAMS, ENV_TASK_INDEX


@dataclass
class Held:
    """An attempt a launcher holds under its claim, as the failure and record paths need it."""

    name: str
    attempt_id: int
    fence: int
    overrides: dict[str, Any] = field(default_factory=dict)
    moved: list[str] = field(default_factory=list)
    spec: SubmitSpec | None = None  # under this launcher's fence (a group member's: its token names its id)


def make_spec(cfg: Config, *, job: str, attempt: int, token: str, run_dir: str | Path, argv: list[str],
              outputs: list[str], env: dict[str, str], resources: dict[str, Any], task: int | None,
              base_env: dict[str, str] | None, batch: str | None = None, fence: int | None = None) -> SubmitSpec:
    """What the backend gets for one attempt (``fence``: its claim's generation, where already known)."""
    return SubmitSpec(job=job, attempt=attempt, token=token, run_dir=Path(run_dir), command=tuple(argv),
                      outputs=tuple(outputs), env=env, resources=resources_of(resources),
                      warning_signal=resources.get("warning_signal") or "TERM", umask=cfg.umask,
                      task=task, base_env=base_env, batch=batch, fence=fence,
                      spot_notice=resources.get("spot_notice") or cfg.spot_notice,
                      spot_url=cfg.spot_url, spot_interval_s=cfg.spot_interval_s, grace_s=STOP_GRACE_S)


def sweep_env(sweep: str, index: int, params: list[dict[str, Any]]) -> dict[str, str]:
    """What a sweep task gets besides ORCH_*: its sweep, its index and its argument set (JSON)."""
    return {ENV_SWEEP: sweep, ENV_TASK_INDEX: str(index),
            ENV_SWEEP_PARAMS: dumps(params[index] if 0 <= index < len(params) else {})}


def new_batch_token() -> str:
    import secrets

    return "b" + secrets.token_hex(8)


def check_and_prepare(cfg: Config, spec: SubmitSpec, plan: Any, outputs: list[str], backend_name: str,
                      keep: list[str] | None = None, batch: protocol.SyncBatch | None = None,
                      in_batch: BatchRecords | None = None) -> list[str] | None:
    """Under the claim: the run dir checked again, then made ready (what was moved aside), or None when its
    marker verifies (nothing to launch). Raises Refused / protocol.UnsafePath (refused for good) or OSError."""
    check_run_dir(cfg, spec.run_dir)
    if protocol.verify_done_marker(spec.run_dir).verified:
        return None
    return prepare_run_dir(cfg, spec, plan, outputs, backend_name, keep, batch, in_batch)


@dataclass
class BatchRecords:
    """A group launch's attempt records for the tasks whose run dirs it made itself (task index -> command
    record), written once in its batch dir (``protocol.BATCH_RECORDS``) beside one ballast pool: each task's
    wrapper puts its command.json and fence.json in place when it starts and takes its ballast from the pool.

    A 1,000-task sweep made 3,000 dirs and 3,000 files before ``sbatch`` (attempts/, attempts/1,
    ballast, command.json, fence.json per task), more than submitit's whole ``map_array``. Only a run dir the
    launch made is left this way: an existing one is cleared and recorded in place as before."""

    token: str
    records: dict[str, dict[str, Any]] = field(default_factory=dict)


def prepare_run_dir(cfg: Config, spec: SubmitSpec, plan: Any, outputs: list[str], backend_name: str,
                    keep: list[str] | None = None, batch: protocol.SyncBatch | None = None,
                    in_batch: BatchRecords | None = None) -> list[str]:
    """Set torn checkpoints aside, clear what the next attempt must not see (never its resume state),
    then write its command record, which names what went to the trash and why (``orch show``).
    ``in_batch``: a run dir made here gets its records there instead (``BatchRecords``)."""
    run_dir = spec.run_dir
    # 0o770 under the umask orch set from orch.toml: 0700, or 0750 with [runs] group_shared (a fixed 0o700
    # made every run dir private although the README promised the group 0750: found by its first test).
    try:
        os.mkdir(run_dir, 0o770)
        created = True
    except FileExistsError:
        created = False
    except FileNotFoundError:  # the runs root itself is missing (removed since the checks): made as before
        run_dir.mkdir(mode=0o770, parents=True, exist_ok=True)
        created = False
    if not created:
        check_run_dir(cfg, run_dir)  # again: it may have been created as a symlink meanwhile
    if created and plan is None and in_batch is not None and spec.batch == in_batch.token \
            and spec.task is not None:
        in_batch.records[str(spec.task)] = _command_record(spec, backend_name, [], {}, [])
        testhooks.site("after_attempt_row")
        return []
    moved: list[str] = []
    why: dict[str, str] = {}
    set_aside: list[Any] = []
    if created and plan is None and _make_fresh(spec.attempt_dir):
        # This launch made the run dir a moment ago: nothing in it to set aside, trash or check (the
        # scans below were a third of a 1,000-task sweep, every one of them of an empty directory).
        pass
    else:
        moved, why, set_aside = _clear_for_attempt(cfg, spec, plan, outputs, keep)
        spec.attempt_dir.mkdir(mode=0o770, parents=True, exist_ok=True)
    # The wrapper's ballast, taken here first: a disk too full for it fails this launch as enospc (never ran)
    # rather than running a program whose end could not be recorded (orchestrator/jobside/ballast.py).
    allocate_ballast(spec.attempt_dir / protocol.EXIT_RESERVE)
    record = _command_record(spec, backend_name, moved, why, set_aside)
    if batch is not None:  # a group launch: in place (and durable) once the caller commits the batch
        batch.write_json(spec.attempt_dir / protocol.COMMAND_FILE, record)
    else:
        protocol.atomic_write_json(spec.attempt_dir / protocol.COMMAND_FILE, record)
    # After the claim, before the backend call: the wrapper runs the program only under this generation.
    group = protocol.GroupSlot(spec.batch, spec.task) if spec.batch and spec.task is not None else None
    protocol.write_fence(spec.attempt_dir, spec.token, spec.fence, batch, group=group)
    testhooks.site("after_attempt_row")
    return moved


def _command_record(spec: SubmitSpec, backend_name: str, moved: list[str], why: dict[str, str],
                    set_aside: list[Any]) -> dict[str, Any]:
    record = {"argv": list(spec.command), "overrides": loads(spec.env.get(protocol.ENV_OVERRIDES)),
              "backend": backend_name, "token": spec.token, "resources": resources_dict(spec.resources),
              "at": protocol.now_iso(),
              TRASHED_KEY: [{"path": p, "why": why.get(p, "")} for p in moved],
              SET_ASIDE_KEY: [x.as_dict() for x in set_aside]}
    if ENV_SWEEP_PARAMS in spec.env:
        # A sweep resubmitted after a lost DB adopts this task's verified result only for the same argument
        # set: a program reading ORCH_SWEEP_PARAMS (no {key} in argv) ran the same argv for other parameters.
        record["sweep_params"] = loads(spec.env[ENV_SWEEP_PARAMS])
    return record


def write_batch_records(run_dir: Path, in_batch: BatchRecords, batch: protocol.SyncBatch) -> None:
    """The batch's records file, in place (and durable) once ``batch`` commits. Raises UnsafePath for a batch dir
    that is a symlink (or under one), OSError."""
    d = protocol.make_batch_dir(run_dir.parent, in_batch.token)
    batch.write(d / protocol.BATCH_RECORDS, json.dumps(in_batch.records, sort_keys=True, separators=(",", ":")))


def reserve_batch_ballast(specs: list[SubmitSpec]) -> None:
    """Right before the group's submission: the ballast of every member whose records wait in the batch, as one
    pool in the batch dir, or each its own where the filesystem cannot free one slot of a pool. Raises the
    OSError (ENOSPC: this launch fails as enospc, never ran, as a member's own ballast failing did), or
    SubmissionRefused for a batch dir that is a symlink."""
    waiting = [s for s in specs if s.records_in_batch and s.batch and s.task is not None]
    if not waiting:
        return
    try:
        pool = protocol.batch_file(waiting[0].run_dir.parent, waiting[0].batch, protocol.BATCH_RESERVE)
    except protocol.UnsafePath as e:  # the batch dir became a symlink since its records were written
        raise SubmissionRefused(f"refusing the batch dir: {e}") from None
    if reserve_pool(pool, [s.task for s in waiting]):  # type: ignore[misc]
        return
    for s in waiting:  # no hole punching here: per task, in the attempt dir its wrapper adopts it from
        s.attempt_dir.mkdir(mode=0o770, parents=True, exist_ok=True)
        allocate_ballast(s.attempt_dir / protocol.EXIT_RESERVE)


def _make_fresh(attempt_dir: Path) -> bool:
    """``attempts/<n>`` made in a run dir this launch just created; False if something got there first."""
    try:
        os.mkdir(attempt_dir.parent, 0o770)
        os.mkdir(attempt_dir, 0o770)
    except FileExistsError:
        return False
    return True


def _clear_for_attempt(cfg: Config, spec: SubmitSpec, plan: Any, outputs: list[str],
                       keep: list[str] | None) -> tuple[list[str], dict[str, str], list[Any]]:
    """What an existing run dir must lose before the attempt starts: (moved to the trash, why each, set aside)."""
    run_dir = spec.run_dir
    # A symlinked attempts/ or a glob through a symlinked dir would make orch write or move things
    # outside its runs root: refused, for this job only.
    protocol.resolve_inside(run_dir, f"{protocol.ATTEMPTS_DIR}/{spec.attempt}")
    keep = keep or []
    # A kill -9 mid-save left a checkpoint every next attempt crashed on: renamed, never deleted.
    set_aside = resumestate.set_aside_torn(run_dir, keep)
    quarantine = plan.quarantine if plan else ()
    why = dict(leftovers_why(run_dir, outputs, quarantine, keep))
    moved = move_to_trash(cfg, run_dir, list(why), spec.job)
    pruned = [p for p in (plan.prune if plan else ()) if p not in moved]
    moved += move_to_trash(cfg, run_dir, pruned, spec.job)
    why.update({p: "pruned by the policy (disk full)" for p in pruned})
    if plan is not None and plan.empty_trash:
        empty_trash(cfg, spec.job)
    if spec.attempt_dir.exists() and spec.token not in attempt_tokens(spec.attempt_dir):
        # attempts/<n>/ left by an earlier run of this name (fresh DB, same runs root): its
        # failure.json would classify this new attempt (an old "invalid" failed it for good).
        rel = f"{protocol.ATTEMPTS_DIR}/{spec.attempt}"
        moved += move_to_trash(cfg, run_dir, [rel], spec.job)
        why[rel] = "an attempt dir of an earlier run of this name"
    return moved, why, set_aside


def attempt_tokens(adir: Path) -> set[str]:
    """Tokens recorded in an attempt dir by orch (command.json, before the backend call) and by its
    wrapper (wrapper.json, exit.json). A job may rewrite command.json (the trainer does), so no
    single file decides whose dir this is."""
    tokens = set()
    for fname in (protocol.COMMAND_FILE, protocol.WRAPPER_FILE, protocol.EXIT_FILE):
        try:
            rec = protocol.read_json_bounded(adir / fname, limit=1 << 20)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("token"), str):
            tokens.add(rec["token"])
    return tokens


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def loads(s: str | None) -> Any:
    return json.loads(s) if s else {}
