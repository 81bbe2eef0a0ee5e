"""Issue 20: a Slurm array's submission is recorded once, in its batch dir, not once per task; each task's fence
record names the batch and the task's index. ``SlurmBackend.live_in_run_dir`` (what ``orch submit``/``orch
sweep`` ask before they use a run dir the DB does not know, issue 9) finds a pending task through that pointer,
and a forged pointer leads nowhere. The scheduler is faked at its command line (``_run``): the claim here is
about the files orch writes and reads; the real cluster runs the same path in tests/slurm/test_sweep_slurm.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator import protocol
from orchestrator.backends.base import Resources, SubmitSpec
from orchestrator.backends.local import real_paths
from orchestrator.backends.slurm import backend as slurm

BATCH = "b0123456789abcdef"


class Slurm:
    """sbatch answers array id 77; squeue answers what ``queue`` holds; every call is kept."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.queue = ""

    def __call__(self, argv: list[str], timeout_s: float, env: dict | None = None) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        out = {"sbatch": "77\n", "squeue": self.queue}.get(argv[0], "")
        return subprocess.CompletedProcess(argv, 0, out, "")

    def asked(self, cmd: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == cmd]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Slurm:
    f = Slurm()
    monkeypatch.setattr(slurm, "_run", f)
    return f


def _task(root: Path, i: int, batch: str | None = BATCH) -> SubmitSpec:
    """A sweep task as the launch leaves it before the backend call: its attempt dir and fence record."""
    s = SubmitSpec(job=f"sw.{i:04d}", attempt=1, token=f"tok{i}", run_dir=root / f"sw.{i:04d}", command=("true",),
                   env={"ORCH_OVERRIDES": "{}"}, resources=Resources(extras={"partition": "spot"}), task=i,
                   fence=1, batch=batch)
    s.attempt_dir.mkdir(parents=True)
    group = protocol.GroupSlot(batch, i) if batch else None
    protocol.write_fence(s.attempt_dir, s.token, 1, group=group)
    return s


def test_an_array_is_recorded_once_in_its_batch_dir_and_its_tasks_get_no_record_each(tmp_path: Path, fake: Slurm):
    specs = [_task(tmp_path, i) for i in range(3)]
    ids = slurm.SlurmBackend().submit_group(specs, BATCH, None)
    assert ids == {f"tok{i}": f"77_{i}" for i in range(3)}
    rec = json.loads((tmp_path / ".orch-batches" / BATCH / "submitted.json").read_text())
    assert (rec["job_id"], rec["batch_token"], rec["tasks"]) == ("77", BATCH, 3)
    assert not any((s.attempt_dir / "slurm").exists() for s in specs)  # was a dir + a record per task


def test_a_task_launched_without_the_pointer_still_gets_its_own_record(tmp_path: Path, fake: Slurm):
    # A caller that did not choose the batch before preparing (its fence record names none): recorded as before.
    s = _task(tmp_path, 0, batch=None)
    slurm.SlurmBackend().submit_group([s], BATCH, None)
    rec = json.loads((s.attempt_dir / "slurm" / "submitted.json").read_text())
    assert (rec["job_id"], rec["token"], rec["batch_token"]) == ("77_0", "tok0", BATCH)


def test_a_pending_array_task_is_found_from_its_run_dir(tmp_path: Path, fake: Slurm):
    specs = [_task(tmp_path, i) for i in range(3)]
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    fake.queue = f"77_1|orch-{BATCH}|PENDING|BeginTime\n77_2|orch-{BATCH}|PENDING|BeginTime\n"
    assert slurm.SlurmBackend().live_in_run_dir(specs[1].run_dir) == ["Slurm job 77_1 (PENDING)"]
    assert len(fake.asked("squeue")) == 1
    fake.queue = ""  # ended: no longer listed
    assert slurm.SlurmBackend().live_in_run_dir(specs[1].run_dir) == []


def test_a_task_recorded_the_old_way_is_still_found(tmp_path: Path, fake: Slurm):
    s = _task(tmp_path, 0, batch=None)
    slurm.SlurmBackend().submit_group([s], BATCH, None)
    fake.queue = f"77_0|orch-{BATCH}|RUNNING|None\n"
    assert slurm.SlurmBackend().live_in_run_dir(s.run_dir) == ["Slurm job 77_0 (RUNNING)"]


@pytest.mark.parametrize("forged", [
    {"group": "../../evil", "task": 0},  # a path, not a batch token: it would lead to <tmp>/evil (made below)
    {"group": BATCH, "task": -1},
    {"group": BATCH, "task": "0"},
    {"group": "b" + "f" * 16, "task": 0},  # a well-formed batch that has no submitted record
])
def test_a_forged_pointer_leads_nowhere(tmp_path: Path, fake: Slurm, forged: dict):
    specs = [_task(tmp_path / "runs", i) for i in range(2)]
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    (tmp_path / "evil").mkdir()  # outside the runs root, a record that would match the forged "batch"
    (tmp_path / "evil" / "submitted.json").write_text(json.dumps({"job_id": "77", "batch_token": "../../evil"}))
    adir = specs[0].attempt_dir
    (adir / "fence.json").write_text(json.dumps({"token": "tok0", "fence": 1, **forged}))
    fake.queue = f"77_0|orch-{BATCH}|PENDING|BeginTime\n77_0|orch-../../evil|PENDING|BeginTime\n"
    assert slurm.SlurmBackend().live_in_run_dir(specs[0].run_dir) == []
    assert fake.asked("squeue") == []


def test_a_batch_record_of_another_batch_is_not_believed(tmp_path: Path, fake: Slurm):
    specs = [_task(tmp_path, 0)]
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    rec = tmp_path / ".orch-batches" / BATCH / "submitted.json"
    rec.write_text(json.dumps({"job_id": "66", "batch_token": "b" + "e" * 16}))  # copied from elsewhere
    assert slurm.SlurmBackend().live_in_run_dir(specs[0].run_dir) == []
    assert fake.asked("squeue") == []


def _waiting(root: Path, n: int, batch: str = BATCH) -> list[SubmitSpec]:
    """Sweep tasks as the quick sweep leaves run dirs it made: nothing in them, their records in the batch."""
    specs = []
    for i in range(n):
        s = SubmitSpec(job=f"sw.{i:04d}", attempt=1, token=f"tok{i}", run_dir=root / f"sw.{i:04d}", command=("true",),
                       env={"ORCH_OVERRIDES": "{}"}, resources=Resources(extras={"partition": "spot"}), task=i,
                       fence=1, batch=batch, records_in_batch=True)
        s.run_dir.mkdir(parents=True)
        specs.append(s)
    (root / ".orch-batches" / batch).mkdir(parents=True)
    (root / ".orch-batches" / batch / protocol.BATCH_RECORDS).write_text(json.dumps({str(i): {} for i in range(n)}))
    return specs


def test_a_pending_task_whose_records_wait_in_its_batch_is_found_from_its_run_dir(tmp_path: Path, fake: Slurm):
    # Its run dir has no attempts/ until the task starts: the batches beside it are asked, one squeue for all.
    specs = _waiting(tmp_path, 3)
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    assert "--batch" in json.loads((tmp_path / ".orch-batches" / BATCH / "tasks.json").read_text())["1"]["argv"]
    fake.queue = f"77_1|orch-{BATCH}|PENDING|BeginTime\n77_2|orch-{BATCH}|RUNNING|None\n"
    b = slurm.SlurmBackend()
    assert b.live_in_run_dir(specs[1].run_dir) == ["Slurm job 77_1 (PENDING)"]
    dirs = [s.run_dir for s in specs]
    assert b.live_in_run_dirs(dirs) == {dirs[0]: [], dirs[1]: ["Slurm job 77_1 (PENDING)"],
                                        dirs[2]: ["Slurm job 77_2 (RUNNING)"]}
    assert len(fake.asked("squeue")) == 2  # one per call, not one per run dir
    fake.queue = f"77_1|orch-{'b' + 'e' * 16}|PENDING|BeginTime\n"  # another batch's job under that id: not it
    assert b.live_in_run_dir(specs[1].run_dir) == []


def test_a_waiting_task_is_found_without_its_arrays_record_and_beside_the_ballast_of_a_non_punching_disk(
        tmp_path: Path, fake: Slurm):
    # The launcher stopped (kill -STOP) between sbatch and the array's submitted.json, and the DB was lost: the
    # batch's job name still finds the task. And where the filesystem cannot punch holes, the launch gave the task
    # an attempt dir holding only its ballast: no fence record there, so the batches are asked too.
    specs = _waiting(tmp_path, 2)
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    (tmp_path / ".orch-batches" / BATCH / "submitted.json").unlink()
    specs[0].attempt_dir.mkdir(parents=True)
    (specs[0].attempt_dir / protocol.EXIT_RESERVE).write_bytes(b"\0" * 4096)
    fake.queue = f"77_0|orch-{BATCH}|PENDING|BeginTime\n77_1|orch-{BATCH}|PENDING|BeginTime\n"
    b = slurm.SlurmBackend()
    assert b.live_in_run_dir(specs[0].run_dir) == ["Slurm job 77_0 (PENDING)"]
    assert b.live_in_run_dirs([specs[1].run_dir]) == {specs[1].run_dir: ["Slurm job 77_1 (PENDING)"]}


def test_a_run_dir_beside_no_waiting_batch_costs_no_squeue(tmp_path: Path, fake: Slurm):
    # An empty run dir (made by hand, or a task's whose batch is gone) beside batches that left no records:
    # nothing to ask the controller about.
    specs = [_task(tmp_path, 0)]
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    (tmp_path / "empty").mkdir()
    assert slurm.SlurmBackend().live_in_run_dirs([tmp_path / "empty", tmp_path / "absent"]) == {
        tmp_path / "empty": [], tmp_path / "absent": []}
    assert fake.asked("squeue") == []


def test_real_paths_are_what_realpath_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The liveness scan resolves each run dir's parent once for all its siblings (issue 20): every case in which
    # that shortcut could differ from os.path.realpath, side by side.
    runs = tmp_path / "runs"
    (runs / "plain").mkdir(parents=True)
    (tmp_path / "elsewhere" / "x").mkdir(parents=True)
    (runs / "link").symlink_to(tmp_path / "elsewhere" / "x")
    (runs / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "alias").symlink_to(runs)
    (runs / "afile").write_text("")
    monkeypatch.chdir(runs)
    paths = [runs / "plain", runs / "link", runs / "dangling", runs / "absent", tmp_path / "alias" / "plain",
             tmp_path / "alias" / "absent", runs / "plain" / "..", runs / ".", runs / "afile" / "x", Path("plain"),
             Path("/"), runs / "link" / "..", runs / "absent" / ".."]
    assert real_paths(paths) == {p: os.path.realpath(p) for p in paths}
