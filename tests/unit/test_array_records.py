"""A Slurm array's submission is recorded once, in its batch dir, not once per task.
``SlurmBackend.live_in_run_dir`` (what ``orch submit``/``orch sweep`` ask before they use a run dir the DB does not
know) finds an array task from the task tables of the batches beside the run dir, by the job names the
controller lists: a queued task's run dir holds nothing yet, and a launcher stopped right after sbatch left no
record of the array's id. The scheduler is faked at its command line (``_run``): the claim here is about the files
orch writes and reads; the real cluster runs the same path in tests/slurm/test_sweep_slurm.py."""

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
    {"group": "../../evil", "task": 0},  # a path, not a batch token
    {"group": BATCH, "task": -1},
    {"group": "b" + "f" * 16, "task": 1},  # another task's slot
])
def test_a_forged_fence_pointer_changes_nothing(tmp_path: Path, fake: Slurm, forged: dict):
    # What a task's run dir shows is read from orch's task table and the controller's job names, not from the
    # files in the run dir a job can rewrite.
    specs = [_task(tmp_path / "runs", i) for i in range(2)]
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    (specs[0].attempt_dir / "fence.json").write_text(json.dumps({"token": "tok0", "fence": 1, **forged}))
    fake.queue = f"77_0|orch-{BATCH}|PENDING|BeginTime\n77_1|orch-../../evil|PENDING|BeginTime\n"
    b = slurm.SlurmBackend()
    assert b.live_in_run_dir(specs[0].run_dir) == ["Slurm job 77_0 (PENDING)"]
    assert b.live_in_run_dir(specs[1].run_dir) == []


def test_a_live_batch_whose_task_table_cannot_be_read_is_cannot_tell_never_none(tmp_path: Path, fake: Slurm):
    specs = [_task(tmp_path, i) for i in range(2)]
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    table = tmp_path / ".orch-batches" / BATCH / "tasks.json"
    table.unlink()
    os.mkfifo(table)  # a FIFO must cost a refusal, not a hang or a "none"
    fake.queue = f"77_1|orch-{BATCH}|PENDING|BeginTime\n"
    (found,) = slurm.SlurmBackend().live_in_run_dir(specs[0].run_dir)
    assert "no readable task table" in found, found
    fake.queue = ""  # nothing of that batch is live: its table is not needed
    assert slurm.SlurmBackend().live_in_run_dir(specs[0].run_dir) == []


def test_a_symlinked_batches_dir_is_not_followed(tmp_path: Path, fake: Slurm):
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    specs = [_task(elsewhere, 0)]
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    (runs / "sw.0000").mkdir(parents=True)
    (runs / ".orch-batches").symlink_to(elsewhere / ".orch-batches")
    fake.queue = f"77_0|orch-{BATCH}|PENDING|BeginTime\n"
    assert slurm.SlurmBackend().live_in_run_dir(runs / "sw.0000") == []
    assert fake.asked("squeue") == []
    with pytest.raises(slurm.SlurmSubmitRefused, match="refusing the batch dir"):
        slurm.SlurmBackend().submit_group([_task(runs, 1)], "b" + "2" * 16, None)


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


def test_a_task_is_found_without_its_arrays_record_queued_or_running(tmp_path: Path, fake: Slurm):
    # The launcher stopped (kill -STOP) between sbatch and the array's submitted.json, and the DB was lost: the
    # batch's job name still finds the task, queued (where the filesystem cannot punch holes, with an attempt dir
    # holding only its ballast) or running (its wrapper's fence record in place: a hostile test submitted a second
    # copy into a running task's run dir from a host that could not see its processes).
    specs = _waiting(tmp_path, 2)
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    (tmp_path / ".orch-batches" / BATCH / "submitted.json").unlink()
    specs[0].attempt_dir.mkdir(parents=True)
    (specs[0].attempt_dir / protocol.EXIT_RESERVE).write_bytes(b"\0" * 4096)
    specs[1].attempt_dir.mkdir(parents=True)
    protocol.claim_fence(specs[1].attempt_dir, "tok1", 1, protocol.GroupSlot(BATCH, 1))
    fake.queue = f"77_0|orch-{BATCH}|PENDING|BeginTime\n77_1|orch-{BATCH}|RUNNING|None\n"
    b = slurm.SlurmBackend()
    assert b.live_in_run_dir(specs[0].run_dir) == ["Slurm job 77_0 (PENDING)"]
    assert b.live_in_run_dirs([specs[1].run_dir]) == {specs[1].run_dir: ["Slurm job 77_1 (RUNNING)"]}


def test_a_started_task_is_found_from_its_fence_record_when_its_batch_dir_is_gone(tmp_path: Path, fake: Slurm):
    # Hostile test: the sweep killed right after sbatch (no submitted.json), the task running, the DB lost and the
    # batch dir removed: a second copy was submitted beside it. Its wrapper's fence record still names the batch.
    import shutil

    specs = _waiting(tmp_path, 2)
    slurm.SlurmBackend().submit_group(specs, BATCH, None)
    specs[0].attempt_dir.mkdir(parents=True)
    protocol.claim_fence(specs[0].attempt_dir, "tok0", 1, protocol.GroupSlot(BATCH, 0))
    shutil.rmtree(tmp_path / ".orch-batches")
    fake.queue = f"77_0|orch-{BATCH}|RUNNING|None\n77_1|orch-{BATCH}|PENDING|BeginTime\n"
    b = slurm.SlurmBackend()
    assert b.live_in_run_dirs([s.run_dir for s in specs]) == {specs[0].run_dir: ["Slurm job 77_0 (RUNNING)"],
                                                              specs[1].run_dir: []}  # its script lost its table
    assert len(fake.asked("squeue")) == 1


def test_an_array_task_whose_task_table_is_a_fifo_ends_at_once_and_runs_nothing(tmp_path: Path):
    # Hostile test: the batch script blocked on a FIFO planted as tasks.json and held its allocation for good.
    import sys

    from orchestrator.backends.slurm.sbatch import array_script

    table = tmp_path / "tasks.json"
    os.mkfifo(table)
    script = tmp_path / "job.sbatch"
    script.write_text(array_script(sys.executable, str(table), "test"))
    p = subprocess.run([sys.executable, str(script)], env={**os.environ, "SLURM_ARRAY_TASK_ID": "0"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "is not a regular file; the task was not run" in p.stderr, p.stderr


def test_a_run_dir_with_no_batch_beside_it_costs_no_squeue(tmp_path: Path, fake: Slurm):
    (tmp_path / "empty").mkdir()  # made by hand: no batch beside it, nothing to ask the controller about
    assert slurm.SlurmBackend().live_in_run_dirs([tmp_path / "empty", tmp_path / "absent"]) == {
        tmp_path / "empty": [], tmp_path / "absent": []}
    assert fake.asked("squeue") == []


def test_real_paths_are_what_realpath_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The liveness scan resolves each run dir's parent once for all its siblings: every case in which
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
