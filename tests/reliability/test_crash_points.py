"""R1: kill the writers at every write / fsync / rename step, and at random times; check what a reader sees.

Three writers, each killed (SIGKILL, see ``crashkit``) before every one of its steps in turn:

- the end of a run: result files through ``protocol.atomic_write``, then ``protocol.write_done_marker``
  (the trainer's finishing sequence, ``trainer/loop.py``);
- the checkpoint writer, ``trainer.checkpoint.CheckpointManager.save`` (commit + prune);
- requeue clearing, ``requeue.requeue`` → ``launch`` → ``trash.move_to_trash`` → command.json →
  backend submit, on a real SQLite DB with a fake backend that records submissions in a file.

After every kill: the marker verifies exactly when the commit rename happened and then lists the
complete result; no committed-name object is partial; the previous verified checkpoint is intact;
nothing was lost (every file is in the run dir or the trash); a sentinel tree outside the runs root,
the trash and the DB (and reachable from the run dir by a symlink) is unchanged; and the recovery
(requeue, the trainer's start-up clean, the reconciler's token lookup) ends in the right state.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import crashkit
import orchkit
import pytest
import torch
from relkit import sentinel, tree_hash

from orchestrator import protocol
from orchestrator.backends.base import AttemptRef, Backend, Outcome, Phase, SubmitSpec
from orchestrator.core.config import load_config
from orchestrator.core.db import Database
from orchestrator.core.jobqueries import get_job
from orchestrator.kit.checkpoint import CheckpointManager
from orchestrator.ops.requeue import RequeueTarget
from orchestrator.ops.requeue import requeue as requeue_jobs
from orchestrator.ops.submit import SubmitRequest, submit
from orchestrator.ops.trash import move_to_trash, unverified_leftovers
from orchestrator.protocol import MarkerStatus

ARTIFACTS = ["result/model.pt", "result/metrics.json"]


def _model_bytes(seed: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    buf = io.BytesIO()
    torch.save({"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)}, buf)
    return buf.getvalue()


# =================================================================================================
# 1. result files + done.json
# =================================================================================================
MODEL = _model_bytes(1)
METRICS = {"final_loss": 1.25, "steps": 60}


def finish_run(run_dir: Path, job: str = "job", attempt: int = 1) -> None:
    """What a run does last (trainer/loop.py ``_finish``): result files atomically, then the marker."""
    (run_dir / "result").mkdir(exist_ok=True)
    protocol.atomic_write(run_dir / "result" / "model.pt", MODEL)
    protocol.atomic_write_json(run_dir / "result" / "metrics.json", METRICS)
    protocol.write_done_marker(run_dir, job, attempt, ARTIFACTS)


def _result_complete(run_dir: Path) -> bool:
    try:
        return ((run_dir / "result" / "model.pt").read_bytes() == MODEL
                and json.loads((run_dir / "result" / "metrics.json").read_text()) == METRICS)
    except (OSError, ValueError):
        return False


def _check_committed_names_whole(run_dir: Path) -> None:
    """A file under its final name is never a prefix: it is absent or complete."""
    m = run_dir / "result" / "model.pt"
    if m.exists():
        assert m.read_bytes() == MODEL, "result/model.pt under its final name is partial"
    j = run_dir / "result" / "metrics.json"
    if j.exists():
        assert json.loads(j.read_text()) == METRICS, "result/metrics.json under its final name is partial"


def test_marker_writer_killed_at_every_step(tmp_path: Path, clean_env: None, record_property) -> None:
    outside = sentinel(tmp_path)
    before_outside = tree_hash(outside)
    template = tmp_path / "template"
    protocol.attempt_dir(template, 1).mkdir(parents=True)
    protocol.atomic_write_json(protocol.attempt_dir(template, 1) / "command.json", {"argv": ["x"]})

    shutil.copytree(template, tmp_path / "count")
    count = crashkit.run(lambda: finish_run(tmp_path / "count"), tmp_path, crash_at=None)
    assert count.completed, count.error
    steps = [s.replace("count/", "") for s in count.labels]
    commit = next(i for i, s in enumerate(steps) if re.match(r"replace done\.json\.tmp-\w+ -> done\.json$", s))
    assert len(steps) >= 12, steps
    record_property("trials", len(steps) + 1)  # bench/bench_reliability.py's table counts kill points
    for k in range(len(steps) + 1):
        run_dir = tmp_path / f"run-{k}"
        shutil.copytree(template, run_dir)
        r = crashkit.run(lambda rd=run_dir: finish_run(rd), tmp_path, crash_at=k)
        where = f"killed before step {k} ({steps[k] if k < len(steps) else 'none: completed'})"
        assert not r.error, f"{where}: {r.error}"
        assert r.killed == (k < len(steps)), where
        v = protocol.verify_done_marker(run_dir)
        # The predicate says VERIFIED exactly when the marker's rename happened, and never CORRUPT:
        # a reader must not see a half-written done.json under its final name.
        assert v.status is not MarkerStatus.CORRUPT, f"{where}: {v}"
        assert v.verified == (k > commit), f"{where}: {v}"
        if v.verified:
            assert _result_complete(run_dir), f"{where}: marker verifies but the result is not complete"
        _check_committed_names_whole(run_dir)
        # Recovery as requeue does it: a verified run is never touched; otherwise clear and rerun.
        if not v.verified:
            cfg = load_config(tmp_path / "home")
            cfg.runs_root = tmp_path
            move_to_trash(cfg, run_dir, unverified_leftovers(run_dir, []), run_dir.name)
            finish_run(run_dir, attempt=2)
            assert protocol.verify_done_marker(run_dir).verified, where
        assert tree_hash(outside) == before_outside, f"{where}: the sentinel outside changed"


# =================================================================================================
# 2. the checkpoint writer
# =================================================================================================
def ckpt_files(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"model.pt": {"w": torch.randn(32, 32, generator=g)},
            "optim.pt": {"state": {0: {"exp_avg": torch.randn(32, 32, generator=g)}}, "step": step},
            "meta.json": {"step": step, "data_sha256": "ab" * 32}}


def _ckpt_equal(path: Path, step: int) -> bool:
    got = CheckpointManager.load(path)
    want = ckpt_files(step)
    return (torch.equal(got["model.pt"]["w"], want["model.pt"]["w"])
            and torch.equal(got["optim.pt"]["state"][0]["exp_avg"], want["optim.pt"]["state"][0]["exp_avg"])
            and got["meta.json"] == want["meta.json"])


def _committed(run_dir: Path) -> dict[int, Path]:
    root = run_dir / protocol.CHECKPOINTS_DIR
    return {protocol.checkpoint_step(p): p for p in (root.iterdir() if root.is_dir() else [])
            if protocol.checkpoint_step(p) is not None}


def _check_checkpoints(run_dir: Path, where: str, prev_hash: str, prev: int = 20) -> dict[int, Path]:
    committed = _committed(run_dir)
    for p in committed.values():
        # Anything under a committed name verifies: a reader never picks up a half-written one.
        assert protocol.verify_checkpoint(p) is None, f"{where}: {p.name} is committed but does not verify"
    assert prev in committed, f"{where}: the previous verified checkpoint step {prev} is gone"
    assert tree_hash(committed[prev]) == prev_hash, f"{where}: step {prev} changed"
    latest = CheckpointManager(run_dir).latest_verified()
    assert latest is not None and latest[0] >= prev, f"{where}: latest verified {latest}"
    return committed


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_checkpoint_writer_killed_at_every_step(tmp_path: Path, clean_env: None, background: bool,
                                                record_property) -> None:
    # background: the trainer's default save, written by the writer thread while training goes on (the
    # kill lands in that thread's writes as well, since a kill takes the whole process).
    outside = sentinel(tmp_path)
    before_outside = tree_hash(outside)
    template = tmp_path / "template"
    m = CheckpointManager(template, keep_last_k=2)
    m.save(10, ckpt_files(10))
    m.save(20, ckpt_files(20))
    prev_hash = tree_hash(_committed(template)[20])

    def save30(run_dir: Path) -> None:
        mgr = CheckpointManager(run_dir, keep_last_k=2)
        mgr.save(30, ckpt_files(30), background=background)
        mgr.wait()

    shutil.copytree(template, tmp_path / "count")
    count = crashkit.run(lambda: save30(tmp_path / "count"), tmp_path)
    assert count.completed, count.error
    steps = [s.replace("count/", "") for s in count.labels]
    # The step that makes the committed name appear (a rename of the tmp dir, if the writer is right).
    commit = next(i for i, s in enumerate(steps) if re.match(r"(rename .* -> |mkdir )checkpoints/step-00000030$", s))
    assert len(steps) >= 12, steps
    record_property("trials", len(steps) + 1)
    for k in range(len(steps) + 1):
        run_dir = tmp_path / f"run-{k}"
        shutil.copytree(template, run_dir)
        r = crashkit.run(lambda rd=run_dir: save30(rd), tmp_path, crash_at=k)
        where = f"killed before step {k} ({steps[k] if k < len(steps) else 'none: completed'})"
        assert not r.error, f"{where}: {r.error}"
        committed = _check_checkpoints(run_dir, where, prev_hash)
        assert (30 in committed) == (k > commit), f"{where}: committed {sorted(committed)}"
        if 30 in committed:
            assert _ckpt_equal(committed[30], 30), f"{where}: step 30 verifies but holds other tensors"
        else:
            assert 10 in committed, f"{where}: step 10 pruned before step 30 committed"
        # Recovery, as the trainer starts: drop tmp dirs, resume from the newest verified, save again.
        mgr = CheckpointManager(run_dir, keep_last_k=2)
        mgr.clean_stale()
        assert not [p for p in (run_dir / "checkpoints").iterdir() if protocol.TMP_INFIX in p.name]
        assert mgr.latest_verified()[0] == (30 if 30 in committed else 20), where
        mgr.save(30, ckpt_files(30))
        # A kill between the commit and the prune leaves step 10 until the next save prunes it.
        assert {20, 30} <= set(_committed(run_dir)), f"{where}: after recovery {sorted(_committed(run_dir))}"
        mgr.save(40, ckpt_files(40))
        assert sorted(_committed(run_dir)) == [30, 40], f"{where}: after the next save {sorted(_committed(run_dir))}"
        assert tree_hash(outside) == before_outside, f"{where}: the sentinel outside changed"


# =================================================================================================
# 3. requeue clearing, through the requeue service, the DB and a backend
# =================================================================================================
class RecordingBackend(Backend):
    """Records each submission (token) in a file, so the parent sees what a killed child submitted."""

    name = "local"

    def __init__(self, log: Path) -> None:
        self.log = log
        self.outcome = Outcome(Phase.RUNNING)

    def submitted(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    def submit(self, spec: SubmitSpec) -> str:
        crashkit.point("backend submit")
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{spec.token}\n".encode())
        os.close(fd)
        crashkit.point("backend accepted; DB not yet updated")
        return f"fake-{spec.token}"

    def poll(self, refs: Sequence[AttemptRef]) -> dict[str, Outcome]:
        return {r.token: self.outcome for r in refs}

    def cancel(self, refs: Sequence[AttemptRef]) -> None:
        pass

    def find_by_token(self, refs: Sequence[AttemptRef]) -> dict[str, str]:
        known = set(self.submitted())
        return {r.token: f"fake-{r.token}" for r in refs if r.token in known}


def _failed_job(home: Path, backend: RecordingBackend, outside: Path) -> None:
    """A job whose attempt 1 crashed, leaving what a crash leaves (and a verified checkpoint to keep)."""
    from orchestrator.ops.reconcile import reconcile_pass

    cfg = load_config(home)
    db = Database(cfg)
    submit(db, cfg, SubmitRequest(name="j", command=["python", "-m", "orch_trainer"]))
    rd = cfg.runs_root / "j"
    m = CheckpointManager(rd, keep_last_k=3)
    m.save(10, ckpt_files(10))
    m.save(20, ckpt_files(20))
    (rd / "checkpoints" / "step-00000020" / "model.pt").write_bytes(b"bit rot")  # committed but corrupt
    tmp = rd / "checkpoints" / "step-00000030.tmp-dead0001"  # a save the crash interrupted
    tmp.mkdir()
    (tmp / "model.pt").write_bytes(b"partial")
    (rd / "result").mkdir()
    (rd / "result" / "model.pt").write_bytes(MODEL[:100])  # partial result
    (rd / "result" / "link-outside").symlink_to(outside / "secret.txt")  # must be moved, never followed
    (rd / "done.json").write_text('{"schema": 1, "job": "j", "attempt": 1, "artifacts": {"result/model.pt": '
                                  '{"size": 5, "sha256": "00"}}}')
    backend.outcome = Outcome(Phase.EXITED, exit_code=1)  # attempt 1 crashed
    rep = reconcile_pass(db, cfg, backend_for=lambda _n: backend)
    backend.outcome = Outcome(Phase.RUNNING)  # every later attempt runs
    assert [c.to for c in rep.changed] == ["retryable_failed"], rep.as_dict()
    db.engine.dispose()


def test_requeue_clearing_killed_at_every_step(tmp_path: Path, clean_env: None, monkeypatch: pytest.MonkeyPatch,
                                               record_property) -> None:
    from orchestrator.ops.reconcile import reconcile_pass

    outside = sentinel(tmp_path)
    before_outside = tree_hash(outside)
    template = tmp_path / "template"
    backend = RecordingBackend(template / "backend.log")
    orchkit.use_backend(monkeypatch, backend)
    monkeypatch.setenv("ORCH_LAUNCH_GRACE_S", "0")  # the reconciler resolves a pending attempt at once
    _failed_job(template, backend, outside)
    keep_hash = tree_hash(template / "runs" / "j" / "checkpoints" / "step-00000010")

    def copy_home(dest: Path) -> None:
        shutil.copytree(template, dest, symlinks=True)
        con = sqlite3.connect(dest / "orch.db")
        con.execute("UPDATE jobs SET run_dir = ?", (str(dest / "runs" / "j"),))
        con.commit()
        con.close()

    def requeue(home: Path) -> None:
        backend.log = home / "backend.log"
        cfg = load_config(home)
        requeue_jobs(Database(cfg), cfg, RequeueTarget.named(["j"]))

    copy_home(tmp_path / "count")
    count = crashkit.run(lambda: requeue(tmp_path / "count"), tmp_path)
    assert count.completed, count.error
    steps = [s.replace("count/", "") for s in count.labels]
    assert len(steps) >= 8, steps
    assert any(s.startswith("rename runs/j/done.json -> trash/j/") for s in steps), steps
    record_property("trials", len(steps) + 1)
    for k in range(len(steps) + 1):
        home = tmp_path / f"home-{k}"
        copy_home(home)
        before_files = crashkit.snapshot_files(home / "runs", home / "trash")
        r = crashkit.run(lambda h=home: requeue(h), tmp_path, crash_at=k)
        where = f"killed before step {k} ({steps[k] if k < len(steps) else 'none: completed'})"
        assert not r.error, f"{where}: {r.error}"
        rd = home / "runs" / "j"
        after_files = crashkit.snapshot_files(home / "runs", home / "trash")
        lost = {h: n for h, n in before_files.items() if after_files.get(h, 0) < n}
        assert not lost, f"{where}: files lost (neither in the run dir nor in the trash): {lost}"
        assert tree_hash(rd / "checkpoints" / "step-00000010") == keep_hash, f"{where}: verified checkpoint changed"
        assert not protocol.verify_done_marker(rd).verified, where
        # Recovery: one reconciler pass finds a lost submission by token, or launches the pending attempt.
        backend.log = home / "backend.log"
        cfg = load_config(home)
        db = Database(cfg)
        reconcile_pass(db, cfg, backend_for=lambda _n: backend)
        with db.read() as s:
            job = get_job(s, "j")
            attempts = [(a.n, a.state, a.token) for a in job.attempts]
            state = job.state
        db.engine.dispose()
        assert state in ("running", "retryable_failed"), f"{where}: {state} {attempts}"
        if state == "running":
            tok = attempts[-1][2]
            # Exactly once: the token of attempt 2 was submitted once, whatever the kill interrupted.
            assert backend.submitted().count(tok) == 1, f"{where}: {backend.submitted()} vs {attempts}"
            assert attempts[-1][:2] == (2, "running"), f"{where}: {attempts}"
            assert unverified_leftovers(rd, []) == [], f"{where}: left {unverified_leftovers(rd, [])}"
            assert (rd / "attempts" / "2" / "command.json").exists(), where
        else:  # killed before requeue committed its DB change: nothing moved yet would be fine too
            assert [a[0] for a in attempts] == [1], f"{where}: {attempts}"
        assert tree_hash(outside) == before_outside, f"{where}: the sentinel outside changed"
        assert (outside / "secret.txt").read_text() == "must never change\n"


def test_crash_points_cover_at_least_twenty_steps(tmp_path: Path, clean_env: None) -> None:
    """The three writers together expose >= 20 kill points (the tests above kill at every one)."""
    n = len(crashkit.run(lambda: finish_run(tmp_path / "a"), tmp_path).labels)
    m = CheckpointManager(tmp_path / "b", keep_last_k=1)
    m.save(1, ckpt_files(1))
    n += len(crashkit.run(lambda: CheckpointManager(tmp_path / "b", keep_last_k=1).save(2, ckpt_files(2)),
                          tmp_path).labels)
    assert n >= 20, n


# =================================================================================================
# random-time kills
# =================================================================================================
def _random_kills(n: int) -> list[float]:
    rng = random.Random(int(os.environ.get("ORCH_SEED", "1234")))
    return [rng.uniform(0.02, 0.6) for _ in range(n)]


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_checkpoint_writer_killed_at_random_times(tmp_path: Path, clean_env: None, background: bool,
        record_property) -> None:
    _checkpoint_random(tmp_path, background, _random_kills(4))
    record_property("trials", 4)


@pytest.mark.long
@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_checkpoint_writer_killed_at_random_times_long(tmp_path: Path, clean_env: None, background: bool,
        record_property) -> None:
    _checkpoint_random(tmp_path, background, _random_kills(100))
    record_property("trials", 100)


def _checkpoint_random(tmp_path: Path, background: bool, delays: list[float]) -> None:
    outside = sentinel(tmp_path)
    before_outside = tree_hash(outside)
    run_dir = tmp_path / "run"
    m = CheckpointManager(run_dir, keep_last_k=2)
    m.save(1, ckpt_files(1))
    for i, delay in enumerate(delays):
        start = max(_committed(run_dir)) + 1

        def loop(start: int = start) -> None:
            mgr = CheckpointManager(run_dir, keep_last_k=2)
            for step in range(start, start + 10_000):
                mgr.save(step, ckpt_files(step % 97), background=background)

        crashkit.kill_at_random(loop, delay, tmp_path)
        where = f"kill {i} after {delay:.3f}s"
        committed = _committed(run_dir)
        for p in committed.values():
            assert protocol.verify_checkpoint(p) is None, f"{where}: {p.name} committed but does not verify"
        newest = max(committed)
        assert newest >= start - 1 and _ckpt_equal(committed[newest], newest % 97), where
        mgr = CheckpointManager(run_dir, keep_last_k=2)
        mgr.clean_stale()
        assert mgr.latest_verified()[0] == newest, where
    assert tree_hash(outside) == before_outside


def _marker_random(tmp_path: Path, delays: list[float]) -> None:
    outside = sentinel(tmp_path)
    before_outside = tree_hash(outside)
    for i, delay in enumerate(delays):
        base = tmp_path / f"kill-{i}"
        base.mkdir()

        def loop(base: Path = base) -> None:
            for j in range(100_000):
                rd = base / f"r{j:05d}"
                rd.mkdir()
                finish_run(rd)

        crashkit.kill_at_random(loop, delay, tmp_path)
        for rd in sorted(base.iterdir()):
            v = protocol.verify_done_marker(rd)
            assert v.status is not MarkerStatus.CORRUPT, f"kill {i}: {rd.name}: {v}"
            if v.verified:
                assert _result_complete(rd), f"kill {i}: {rd.name} verifies but its result is not complete"
            _check_committed_names_whole(rd)
    assert tree_hash(outside) == before_outside


def test_marker_writer_killed_at_random_times(tmp_path: Path, clean_env: None, record_property) -> None:
    _marker_random(tmp_path, _random_kills(4))
    record_property("trials", 4)


@pytest.mark.long
def test_marker_writer_killed_at_random_times_long(tmp_path: Path, clean_env: None, record_property) -> None:
    _marker_random(tmp_path, _random_kills(100))
    record_property("trials", 100)
