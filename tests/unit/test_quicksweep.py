"""orchestrator.ops.quicksweep: ``orch sweep`` on a group-queue scheduler without SQLAlchemy writes what the
SQLAlchemy path writes, and a batched step that does not match every task is rolled back whole and decided task by
task by ``launch``'s own function (each such deviation made to happen for real in the DB here)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from orchkit import assert_launch_times, at_site
from sqlalchemy import select, update

from orchestrator.backends.base import Backend, BackendError, Capabilities, SubmissionRefused
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState, utcnow
from orchestrator.core.models import Attempt, Event, Job, Sweep
from orchestrator.errors import Refused
from orchestrator.ops import quicksweep
from orchestrator.ops.sweep import SweepRequest, submit_sweep

ROOT = Path(__file__).resolve().parents[2]
PER_ROW = {"id", "job_id", "name", "run_dir", "token", "created_at", "updated_at", "claimed_at", "submitted_at",
           "external_id", "batch_token", "sweep_id"}


class Arrays(Backend):
    """A scheduler that keeps the group's queue (a Slurm array), at its boundary only: ids ``<n>_<task>``."""

    name = "arrays"
    capabilities = Capabilities(group_queue=True)

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.specs: list = []  # every SubmitSpec submitted, as the scheduler got it
        self.batches: list[str] = []
        self.cancelled: list[list[str]] = []
        self.fail: Exception | None = None

    def submit(self, spec):
        raise AssertionError("a group-queue sweep is submitted as one group")

    def submit_group(self, specs, batch_token, throttle):
        if self.fail is not None:
            raise self.fail
        self.groups.append([s.job for s in specs])
        self.specs += specs
        self.batches.append(batch_token)
        return {s.token: f"{len(self.groups)}_{s.task}" for s in specs}

    def poll(self, refs):
        return {}

    def cancel(self, refs):
        self.cancelled.append(sorted(r.external_id for r in refs))

    def find_by_token(self, refs):
        return {}

    def max_group_size(self):
        return None


@pytest.fixture
def arrays(monkeypatch, tmp_path) -> Arrays:
    """The fake scheduler, and an empty queue at ``squeue`` (a PATH shim): a run dir beside a batch dir is checked
    against the controller's queue, and on a machine without Slurm that check cannot tell (a refusal)."""
    b = Arrays()
    shim = tmp_path / "squeue-shim"
    shim.mkdir()
    (shim / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (shim / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    for mod in ("orchestrator.ops.sweep", "orchestrator.ops.quicksweep", "orchestrator.ops.launch",
                "orchestrator.ops.launchrecord"):
        monkeypatch.setattr(f"{mod}.get_backend", lambda _name: b)
    return b


def _req(name: str, n: int = 3) -> SweepRequest:
    return SweepRequest(name=name, command=["python", "train.py", "--lr", "{lr}"],
                        params=[{"lr": 10.0 ** -i} for i in range(n)], backend="arrays",
                        resources={"time_limit": "01:00:00"}, max_attempts=4, outputs=["model.pt"], throttle=2)


def _start(spec, **kw) -> subprocess.CompletedProcess:
    """The task started as its scheduler starts it: the wrapper's argv, in its run dir, with its environment."""
    env = {**os.environ, **spec.env, "PYTHONPATH": str(ROOT)}
    return subprocess.run(spec.wrapper_argv(sys.executable), cwd=spec.run_dir, env=env, capture_output=True,
                          text=True, timeout=120, **kw)


def _rows(db, sweep: str, since: datetime) -> list:
    """The sweep's rows less what differs by design; each task's times checked for order and for falling since
    ``since``."""
    until = utcnow()
    with db.read() as s:
        sw = s.scalar(select(Sweep).where(Sweep.name == sweep))
        out = [(sw.backend, sw.throttle, sw.params)]
        for job in sw.tasks:
            out.append({c.key: getattr(job, c.key) for c in Job.__mapper__.column_attrs if c.key not in PER_ROW})
            out += [{c.key: getattr(a, c.key) for c in Attempt.__mapper__.column_attrs if c.key not in PER_ROW}
                    for a in job.attempts]
            ext = job.attempts[-1].external_id or "-"
            out += [(e.attempt_id is None, e.from_state, e.to_state, e.reason.replace(ext, "ID"))
                    for e in s.scalars(select(Event).where(Event.job_id == job.id).order_by(Event.id))]
            assert job.attempts[-1].batch_token
            assert_launch_times(job, since, until)
    return out


def test_a_quick_sweep_writes_the_rows_the_sqlalchemy_path_writes(db, cfg, arrays):
    since = utcnow()
    out = quicksweep.sweep(cfg, _req("quick"))  # first: the slow path then finds its environment row
    submit_sweep(db, cfg, _req("slow"))
    assert out is not None and out.all_submitted and out.tasks == 3
    assert _rows(db, "quick", since) == _rows(db, "slow", since)
    assert arrays.groups == [["quick.0000", "quick.0001", "quick.0002"], ["slow.0000", "slow.0001", "slow.0002"]]
    for i in range(3):  # each task's records in place, under its fence (the quick path: once the task starts)
        assert (cfg.runs_root / f"slow.{i:04d}" / "attempts" / "1" / "fence.json").is_file()
        assert [s.records_in_batch for s in arrays.specs] == [True] * 3 + [False] * 3


def test_each_tasks_fence_record_names_the_array_it_went_out_in_on_both_paths(db, cfg, arrays):
    # The array's one submitted record (Slurm: <batch dir>/submitted.json) is found from a task's run dir through
    # this pointer: without it a run dir whose DB was lost hid its pending task (SlurmBackend.live_in_run_dir).
    from orchestrator import protocol

    quicksweep.sweep(cfg, _req("quick"))
    submit_sweep(db, cfg, _req("slow"))
    for spec in arrays.specs[:3]:  # the quick path's tasks put their records in place when they start
        assert _start(spec).returncode == 2  # no train.py here: the program ran, and python said so (exit 2)
        assert protocol.read_exit(spec.attempt_dir).returncode == 2
    for sweep, batch in zip(("quick", "slow"), arrays.batches, strict=True):
        for i in range(3):
            with db.read() as s:
                recorded = get_job(s, f"{sweep}.{i:04d}").attempts[0].batch_token
            slot = protocol.read_group_slot(cfg.runs_root / f"{sweep}.{i:04d}" / "attempts" / "1")
            assert slot == protocol.GroupSlot(batch, i) and recorded == batch, (sweep, i, slot, recorded)


def _launcher_dies_after_sbatch(db, cfg, monkeypatch, req: SweepRequest) -> None:
    """``req``'s quick sweep killed right after its sbatch (before it recorded the ids); its claims expire."""
    from datetime import timedelta

    from orchestrator.core.states import utcnow

    class Died(BaseException):
        pass

    def died() -> None:
        raise Died

    at_site(monkeypatch, "after_backend_submit", died)
    with pytest.raises(Died):
        quicksweep.sweep(cfg, req)
    monkeypatch.undo()
    with db.write() as s:
        s.execute(update(Attempt).values(claimed_at=utcnow() - timedelta(hours=1)))


def test_a_reclaimed_task_whose_old_array_turns_up_is_adopted_under_that_arrays_pointer(db, cfg, arrays,
                                                                                      monkeypatch):
    # The sweep's launcher dies right after sbatch; the reconciler's first look-up misses the array, it
    # re-claims each task (fence 2 in its record), and its second look-up finds the old array: each task is
    # adopted, its fence record restored to generation 1 AND to the old array (the pointer live_in_run_dir
    # follows), not left naming a batch that was never submitted.
    from orchestrator import protocol
    from orchestrator.ops.reconcile import reconcile_pass

    _launcher_dies_after_sbatch(db, cfg, monkeypatch, _req("a"))
    (old,) = arrays.batches
    looks: list[list[str]] = []

    def find_by_token(refs):  # the pass's look-up misses it, the re-claim's finds it
        looks.append([r.token for r in refs])
        return {} if len(looks) == 1 else {old: "1"}

    arrays.find_by_token = find_by_token
    for mod in ("orchestrator.ops.sweep", "orchestrator.ops.launch", "orchestrator.ops.launchrecord"):
        monkeypatch.setattr(f"{mod}.get_backend", lambda _name: arrays)
    reconcile_pass(db, cfg, backend_for=lambda _name: arrays)
    assert len(arrays.batches) == 1  # adopted: nothing submitted a second time
    for i in range(3):
        with db.read() as s:
            a = get_job(s, f"a.{i:04d}").attempts
        assert [(x.state, x.external_id) for x in a] == [(AttemptState.SUBMITTED, f"1_{i}")], a
        adir = cfg.runs_root / f"a.{i:04d}" / "attempts" / "1"
        assert protocol.read_fence(adir)[1] == 1
        assert protocol.read_group_slot(adir) == protocol.GroupSlot(old, i)


def test_it_leaves_to_the_sqlalchemy_path_what_it_does_not_do_and_writes_nothing(db, cfg, arrays, monkeypatch):
    from orchestrator.backends import get_backend

    # the local backend keeps its own queue (a throttle under a lock): not this path
    monkeypatch.setattr("orchestrator.ops.quicksweep.get_backend", lambda n: get_backend(n) if n == "local" else arrays)
    assert quicksweep.sweep(cfg, SweepRequest(name="loc", command=["true"], params=[{}], backend="local")) is None
    # a task whose run dir holds a verified result is recorded done by the SQLAlchemy path
    from orchestrator import protocol

    done = cfg.runs_root / "v.0000"
    (done / "attempts" / "1").mkdir(parents=True)
    (done / "attempts" / "1" / "command.json").write_text('{"argv": ["true"], "sweep_params": {}}')
    (done / "out").write_text("x")
    protocol.write_done_marker(done, "v.0000", 1, ["out"])
    assert quicksweep.sweep(cfg, SweepRequest(name="v", command=["true"], params=[{}, {}], backend="arrays")) is None
    with db.read() as s:
        assert s.scalar(select(Job.id)) is None and s.scalar(select(Sweep.id)) is None
    assert arrays.groups == []


def test_a_task_claimed_by_another_launcher_first_is_left_to_it(db, cfg, arrays, monkeypatch):
    from orchestrator.ops import launchclaim

    real = quicksweep.mtbf_env_from

    def one_claimed_meanwhile(*a, **kw):  # between the rows and the claims
        with db.read() as s:
            attempt_id = get_job(s, "c.0001").attempts[-1].id
        assert launchclaim.claim(db, attempt_id, reclaim=False) == 1
        return real(*a, **kw)

    monkeypatch.setattr(quicksweep, "mtbf_env_from", one_claimed_meanwhile)
    out = quicksweep.sweep(cfg, _req("c"))
    assert not out.all_submitted and arrays.groups == [["c.0000", "c.0002"]]  # the claim step, decided per task
    with db.read() as s:
        assert get_job(s, "c.0001").attempts[-1].state is AttemptState.LAUNCHING  # its claimer launches it


def test_a_task_cancelled_while_the_group_prepared_is_closed_unlaunched_and_the_rest_go(db, cfg, arrays,
                                                                                        monkeypatch):
    from orchestrator.ops.cancel import cancel

    at_site(monkeypatch, "before_backend_submit", lambda: cancel(db, cfg, ["k.0002"]))
    out = quicksweep.sweep(cfg, _req("k"))
    assert not out.all_submitted and arrays.groups == [["k.0000", "k.0001"]]
    with db.read() as s:
        assert get_job(s, "k.0002").attempts[-1].state is AttemptState.CANCELLED
        assert get_job(s, "k.0000").attempts[-1].state is AttemptState.SUBMITTED


def test_a_claim_lost_before_the_group_submission_keeps_that_task_out_of_the_array_on_the_slow_path(
        db, cfg, arrays, monkeypatch):
    """launch_group re-checks every claim in the DB after the records are flushed and before the one backend call:
    a task re-claimed meanwhile (this launcher stalled past the grace) is its re-claimer's to launch, so it is not
    in this launcher's array (two live copies of it otherwise), and its row is left as the re-claimer holds it."""
    def reclaimed() -> None:
        with db.write() as s:
            a = get_job(s, "q.0001").attempts[-1]
            s.execute(update(Attempt).where(Attempt.id == a.id).values(fence=Attempt.fence + 1))

    at_site(monkeypatch, "before_backend_submit", reclaimed)
    sweep = submit_sweep(db, cfg, _req("q"))  # SQLAlchemy's path: launch.launch_group
    assert sweep.name == "q" and arrays.groups == [["q.0000", "q.0002"]]
    with db.read() as s:
        a = get_job(s, "q.0001").attempts[-1]
        assert (a.state, a.fence, a.launched_fence, a.external_id) == (AttemptState.LAUNCHING, 2, None, None)
        assert get_job(s, "q.0000").attempts[-1].state is AttemptState.SUBMITTED


def test_a_claim_lost_during_the_group_submission_is_not_recorded_over_the_reclaimer(db, cfg, arrays,
                                                                                      monkeypatch):
    def reclaimed() -> None:
        with db.write() as s:
            a = get_job(s, "r.0001").attempts[-1]
            s.execute(update(Attempt).where(Attempt.id == a.id).values(fence=Attempt.fence + 1))

    at_site(monkeypatch, "after_backend_submit", reclaimed)
    out = quicksweep.sweep(cfg, _req("r"))
    assert not out.all_submitted
    with db.read() as s:
        states = {j.name: j.attempts[-1].state for j in s.scalars(select(Job))}
    assert states == {"r.0000": AttemptState.SUBMITTED, "r.0001": AttemptState.LAUNCHING,
                      "r.0002": AttemptState.SUBMITTED}


def test_one_task_refused_while_preparing_fails_alone(db, cfg, arrays, monkeypatch, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    bad = cfg.runs_root / "p.0001"
    at_site(monkeypatch, "names_checked", lambda: (bad.mkdir(parents=True),
                                               (bad / "attempts").symlink_to(tmp_path / "elsewhere")))
    out = quicksweep.sweep(cfg, _req("p"))
    assert not out.all_submitted and arrays.groups == [["p.0000", "p.0002"]]
    with db.read() as s:
        job = get_job(s, "p.0001")
        assert job.state is JobState.FAILED and job.attempts[-1].failure_class.value == "invalid"
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("permanent", [False, True])
def test_a_failed_group_submission_is_handled_as_launch_handles_it(db, cfg, arrays, permanent):
    arrays.fail = (SubmissionRefused if permanent else BackendError)("sbatch: error: no")
    out = quicksweep.sweep(cfg, _req("f"))
    assert not out.all_submitted
    with db.read() as s:
        attempts = [j.attempts[-1] for j in s.scalars(select(Job))]
    pool = cfg.runs_root / ".orch-batches" / attempts[0].batch_token / "exit.reserve"
    if permanent:
        assert {a.state for a in attempts} == {AttemptState.FAILED}
        assert not pool.exists()  # each task's end gave its room back (ending.finish)
    else:  # the claims stay: the reconciler looks the batch token up, then retries
        assert {a.state for a in attempts} == {AttemptState.LAUNCHING}
        assert all(a.detail.startswith("submission failed (will be retried)") for a in attempts)
        assert pool.exists()  # the array may have gone out after all, and be adopted


def test_a_taken_name_is_refused_with_nothing_written(db, cfg, arrays):
    quicksweep.sweep(cfg, _req("t"))
    with pytest.raises(Refused, match="already exist"):
        quicksweep.sweep(cfg, _req("t"))
    with db.read() as s:
        assert len(list(s.scalars(select(Job)))) == 3


def test_orch_sweep_on_slurm_imports_no_sqlalchemy(tmp_path):
    """A real `orch sweep --backend slurm` as a user runs it (sbatch a PATH shim printing an id: no cluster)."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (shim / "sbatch").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    env.update(ORCH_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT), PATH=f"{shim}:{env['PATH']}")
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "status"], env=env, check=True, capture_output=True)
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator.cli", "sweep", "--name", "s",
                        "--grid", "i=1,2,3", "--backend", "slurm", "--", "echo", "{i}"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout == "sweep s: 3 tasks on slurm; 3 submitted\n"
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")]
    assert "orchestrator.ops.quicksweep" in imported
    assert not [m for m in imported if m.startswith(("sqlalchemy", "orchestrator.core.models", "alembic"))]


def test_a_task_cancelled_during_the_group_submission_is_stopped_before_the_slow_path_records_it(
        db, cfg, arrays, monkeypatch):
    """Its array task was submitted with the others; the quick record misses it, and it is stopped at once (as
    launchrecord.record_in decides), not after SQLAlchemy's import: a short task ran to a verified end meanwhile."""
    from orchestrator.ops import launchrecord
    from orchestrator.ops.cancel import cancel

    at_site(monkeypatch, "after_backend_submit", lambda: cancel(db, cfg, ["g.0001"]))
    seen: list = []
    real = launchrecord.record_group
    monkeypatch.setattr(launchrecord, "record_group", lambda *a, **kw: (seen.append(list(arrays.cancelled)),
                                                                   real(*a, **kw))[1])
    out = quicksweep.sweep(cfg, _req("g"))
    assert not out.all_submitted and seen == [[["1_1"]]] and arrays.cancelled == [["1_1"]]
    with db.read() as s:
        states = {j.name: j.attempts[-1].state for j in s.scalars(select(Job))}
    assert states == {"g.0000": AttemptState.SUBMITTED, "g.0001": AttemptState.STOPPING,
                      "g.0002": AttemptState.SUBMITTED}



# --- a run dir the quick sweep made: the task's records wait in its batch until the task starts -------------
# Before, attempts/, attempts/1, a ballast, command.json and fence.json per task were more filesystem work than
# submitit's whole map_array. Each task's wrapper (the real one here, started as Slurm starts it) puts its records
# in place; the claims below are what that must keep: the fence, a cancel, a re-claim, the ballast's room.

def _writes(name: str, n: int = 3) -> SweepRequest:
    return SweepRequest(name=name, command=["sh", "-c", "echo {lr} > model.pt"],
                        params=[{"lr": 10.0 ** -i} for i in range(n)], backend="arrays",
                        resources={"time_limit": "01:00:00"}, max_attempts=4, outputs=["model.pt"])


def _pool(cfg, batch: str) -> Path:
    from orchestrator import protocol

    return cfg.runs_root / protocol.BATCHES_DIR / batch / protocol.BATCH_RESERVE


def _slots_held(pool: Path) -> int:
    from orchestrator.jobside.ballast import SLOT_BYTES

    return pool.stat().st_blocks * 512 // SLOT_BYTES if pool.exists() else 0


def test_a_started_task_puts_its_records_in_place_and_its_ballast_room_moves_from_the_batch(db, cfg, arrays):
    import json

    from orchestrator import protocol

    out = quicksweep.sweep(cfg, _writes("w"))
    assert out.all_submitted
    (batch,) = arrays.batches
    records = json.loads((cfg.runs_root / protocol.BATCHES_DIR / batch / protocol.BATCH_RECORDS).read_text())
    assert sorted(records) == ["0", "1", "2"] and records["1"]["sweep_params"] == {"lr": 0.1}
    for spec in arrays.specs:  # queued: a run dir and nothing in it; the batch holds each task's room
        assert list(spec.run_dir.iterdir()) == []
    assert _slots_held(_pool(cfg, batch)) == 3
    spec = arrays.specs[1]
    assert _start(spec).returncode == 0
    adir = spec.attempt_dir
    assert protocol.read_fence(adir) == (spec.token, 1)
    assert protocol.read_group_slot(adir) == protocol.GroupSlot(batch, 1)
    assert json.loads((adir / protocol.COMMAND_FILE).read_text()) == records["1"]
    assert protocol.verify_done_marker(spec.run_dir).verified
    assert not (adir / protocol.EXIT_RESERVE).exists()  # its own ballast, given back at its end
    assert _slots_held(_pool(cfg, batch)) == 2  # its slot given back when it took its own
    for spec in (arrays.specs[0], arrays.specs[2]):
        assert _start(spec).returncode == 0
    assert not _pool(cfg, batch).exists()  # no slot held: the pool file goes


def test_a_task_cancelled_before_its_wrapper_started_runs_nothing_when_it_does(db, cfg, arrays, monkeypatch):
    # The array task may start before the launcher's record stops it: the cancel's fence (generation 0) must be in
    # place before the wrapper's own, although the launch made no attempt dir (stop.revoke_launch makes it).
    from orchestrator import protocol
    from orchestrator.ops.cancel import cancel

    at_site(monkeypatch, "after_backend_submit", lambda: cancel(db, cfg, ["g.0001"]))
    quicksweep.sweep(cfg, _writes("g"))
    (batch,) = arrays.batches
    spec = arrays.specs[1]
    assert _start(spec).returncode == 0
    assert (spec.attempt_dir / protocol.SUPERSEDED_FILE).is_file()
    assert not (spec.run_dir / "model.pt").exists() and not protocol.verify_done_marker(spec.run_dir).verified
    assert _slots_held(_pool(cfg, batch)) == 2  # nobody runs under its slot: given back


def test_a_task_relaunched_by_a_reclaimer_runs_once_whichever_array_starts_it(db, cfg, arrays, monkeypatch):
    # The sweep's launcher dies right after sbatch; the reconciler does not find that array and relaunches each
    # task in a new one. Both arrays exist: the first one's wrappers must run nothing, the second one's run.
    from orchestrator import protocol
    from orchestrator.ops.reconcile import reconcile_pass

    _launcher_dies_after_sbatch(db, cfg, monkeypatch, _writes("a"))
    for mod in ("orchestrator.ops.sweep", "orchestrator.ops.launch", "orchestrator.ops.launchrecord"):
        monkeypatch.setattr(f"{mod}.get_backend", lambda _name: arrays)
    reconcile_pass(db, cfg, backend_for=lambda _name: arrays)
    old, new = arrays.batches
    assert len(arrays.specs) == 6 and not _pool(cfg, old).exists()  # the relaunch gave the old batch's room back
    for first, second in zip(arrays.specs[:3], arrays.specs[3:], strict=True):
        assert _start(first).returncode == 0 and (first.attempt_dir / protocol.SUPERSEDED_FILE).is_file()
        assert not (first.run_dir / "model.pt").exists()
        assert _start(second).returncode == 0 and protocol.verify_done_marker(second.run_dir).verified
        assert protocol.read_group_slot(second.attempt_dir) == protocol.GroupSlot(new, second.task)


def test_where_no_slot_of_a_pool_can_be_freed_each_task_gets_its_own_ballast_at_launch(db, cfg, arrays,
                                                                                       monkeypatch):
    # A filesystem without hole punching (said by fallocate's EOPNOTSUPP, faked here: the dev machine's all punch)
    # could never give a started task's slot back: the pool would hold the whole batch's room until its end.
    import errno

    from orchestrator import protocol
    from orchestrator.jobside import ballast

    def cannot(*_a):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(ballast, "_punch", cannot)
    assert quicksweep.sweep(cfg, _writes("np")).all_submitted
    (batch,) = arrays.batches
    assert not _pool(cfg, batch).exists()
    for spec in arrays.specs:
        assert (spec.attempt_dir / protocol.EXIT_RESERVE).stat().st_blocks * 512 >= ballast.BALLAST_BYTES
        assert not (spec.attempt_dir / protocol.FENCE_FILE).exists()  # its records still wait in the batch
    assert _start(arrays.specs[0]).returncode == 0 and protocol.verify_done_marker(arrays.specs[0].run_dir).verified
