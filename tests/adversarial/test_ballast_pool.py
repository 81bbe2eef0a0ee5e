"""A group launch's ballast pool (orchestrator/jobside/ballast.py) on real filesystems: one file holds a slot
per task; a task's wrapper gives its slot back first when it starts, and on a disk that filled while the task was
queued makes its attempt dir, records and ballast in that room. Without it the task ran with nowhere to record its
end, and ended ``unknown`` (what a hostile test found of the per-task ballast)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from advkit import fill_fs, tmpfs
from orchkit import PY, ROOT

from orchestrator.jobside.ballast import SLOT_BYTES, release_slot, reserve_pool


def _held(pool: Path) -> int:
    """Whole slots' worth of blocks the pool still holds."""
    return pool.stat().st_blocks * 512 // SLOT_BYTES if pool.exists() else 0


def test_each_slot_is_held_until_given_back_and_the_pool_goes_with_the_last(tmp_path: Path):
    pool = tmp_path / "exit.reserve"
    assert reserve_pool(pool, [0, 1, 2, 7, 8])  # a relaunch's subset of a sweep: slots need not be consecutive
    assert _held(pool) == 5
    release_slot(pool, 7)
    release_slot(pool, 7)  # again: nothing more
    assert _held(pool) == 4
    for i in (0, 1, 2, 8):
        release_slot(pool, i)
    assert not pool.exists()
    release_slot(pool, 0)  # a pool that is gone: nothing to do, no error


def test_a_pool_is_never_made_over_a_file_or_through_a_symlink(tmp_path: Path):
    (tmp_path / "target").write_text("theirs")
    (tmp_path / "exit.reserve").symlink_to(tmp_path / "target")
    try:
        reserve_pool(tmp_path / "exit.reserve", [0])
    except FileExistsError:
        pass
    else:
        raise AssertionError("a pool was made over what was there")
    assert (tmp_path / "target").read_text() == "theirs"


def test_a_disk_too_full_for_the_pool_raises_enospc_and_leaves_nothing(tmp_path: Path):
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        try:
            reserve_pool(mnt / "exit.reserve", range(8))  # 2 MiB on a 1 MiB disk
        except OSError as e:
            assert e.errno == 28, e
        else:
            raise AssertionError("no ENOSPC")
        assert list(mnt.iterdir()) == []


def test_a_started_wrapper_on_a_full_disk_still_records_its_end(tmp_path: Path):
    """End to end with the real wrapper, as an array task starts: its records wait in the batch, the disk filled
    while it was queued, and its program fails for want of space: exit.json says so (class enospc), where
    without the pool's room it could not be written at all."""
    import json

    from orchestrator import protocol

    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        run = mnt / "runs" / "t.0000"
        run.mkdir(parents=True)
        batch = "b" + "1" * 16
        bdir = run.parent / protocol.BATCHES_DIR / batch
        bdir.mkdir(parents=True)
        (bdir / protocol.BATCH_RECORDS).write_text(json.dumps({"0": {"argv": ["sh"], "token": "tok"}}))
        assert reserve_pool(bdir / protocol.BATCH_RESERVE, [0])
        fill_fs(mnt / "filler")
        argv = [PY, "-m", "orchestrator.jobside.wrapper", "--run-dir", str(run), "--job", "t.0000", "--attempt", "1",
                "--token", "tok", "--fence", "1", "--batch", batch, "--task", "0", "--outputs", "out.bin",
                "--", "sh", "-c", "head -c 100000 /dev/urandom > out.bin"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        p = subprocess.run(argv, cwd=run, env=env, capture_output=True, text=True, timeout=120)
        rec = protocol.read_exit(protocol.attempt_dir(run, 1))
        assert rec is not None, (p.returncode, p.stderr[-2000:])
        assert rec.returncode == 1 and rec.disk_full, rec  # head: "No space left on device"
        assert not protocol.verify_done_marker(run).verified
        assert not (bdir / protocol.BATCH_RESERVE).exists()  # its one slot given back: the pool went


def test_a_sweep_on_a_disk_too_full_for_its_tasks_ballast_submits_nothing_and_fails_as_enospc(tmp_path: Path):
    """A real `orch sweep --backend slurm` (sbatch a PATH shim that logs each call): its 10 tasks' room does not
    fit on a 1 MiB runs root, so the launch fails as enospc (retried once space is back) before the scheduler is
    asked, where a program that started would have had nowhere to record its end."""
    import json

    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sbatch").write_text(f"#!/bin/sh\necho called >> {tmp_path / 'sbatch.log'}\necho 4242\n")
    (shim / "sbatch").chmod(0o755)
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        home = tmp_path / "home"
        home.mkdir()
        (home / "orch.toml").write_text(f'[runs]\nroot = "{mnt / "runs"}"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
        env.update(ORCH_HOME=str(home), PYTHONPATH=str(ROOT), PATH=f"{shim}:{env['PATH']}")
        run = [PY, "-m", "orchestrator.cli"]
        subprocess.run([*run, "status"], env=env, check=True, capture_output=True)
        p = subprocess.run([*run, "sweep", "--name", "s", "--grid", "i=" + ",".join(map(str, range(10))),
                            "--backend", "slurm", "--", "echo", "{i}"], env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0 and p.stdout == "sweep s: 10 tasks on slurm; 10 retryable_failed\n", (p.stdout,
                                                                                                     p.stderr)
        assert not (tmp_path / "sbatch.log").exists()
        shown = json.loads(subprocess.run([*run, "show", "s.0003", "--json"], env=env, check=True,
                                          capture_output=True, text=True).stdout)
        first = shown["attempts"][0]
        assert first["failure_class"] == "enospc" and "No space left" in first["detail"], first
        assert not list((mnt / "runs" / ".orch-batches").glob("*/exit.reserve"))


def test_a_forged_batch_argument_leads_the_wrapper_nowhere(tmp_path: Path):
    # The batch token becomes a path component of the pool the wrapper punches and the records it reads.
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "exit.reserve").write_bytes(b"keep" * 1024)
    run = tmp_path / "runs" / "t.0000"
    run.mkdir(parents=True)
    argv = [PY, "-m", "orchestrator.jobside.wrapper", "--run-dir", str(run), "--job", "t.0000", "--attempt", "1",
            "--token", "tok", "--fence", "1", "--batch", "../../x", "--task", "0", "--", "true"]
    p = subprocess.run(argv, cwd=run, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                       text=True, timeout=120)
    assert "ignoring --batch" in p.stderr, p.stderr
    assert (tmp_path / "x" / "exit.reserve").read_bytes() == b"keep" * 1024
    assert p.returncode == 0 and (run / "attempts" / "1" / "superseded.json").is_file()  # no fence: ran nothing


def test_giving_a_slot_back_never_blocks_on_a_fifo_nor_touches_a_linked_or_outside_file(tmp_path: Path):
    """Hostile test: a FIFO planted as the pool hung every reconcile pass (the task's end gives its slot back);
    a hard link to another file, or a symlinked batch dir, had that file's bytes zeroed."""
    import threading

    from orchestrator import protocol
    from orchestrator.jobside.ballast import give_back

    batch = "b" + "3" * 16
    run = tmp_path / "runs" / "t.0000"
    bdir = run.parent / protocol.BATCHES_DIR / batch
    bdir.mkdir(parents=True)
    os.mkfifo(bdir / protocol.BATCH_RESERVE)
    t = threading.Thread(target=give_back, args=(run, batch, 0), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "blocked opening a FIFO"
    (bdir / protocol.BATCH_RESERVE).unlink()
    victim = tmp_path / "victim.bin"
    data = os.urandom(2 * SLOT_BYTES)
    victim.write_bytes(data)
    os.link(victim, bdir / protocol.BATCH_RESERVE)
    give_back(run, batch, 0)
    assert victim.read_bytes() == data
    (bdir / protocol.BATCH_RESERVE).unlink()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / protocol.BATCH_RESERVE).write_bytes(data)
    bdir.rmdir()
    bdir.symlink_to(outside)
    give_back(run, batch, 0)
    assert (outside / protocol.BATCH_RESERVE).read_bytes() == data


def test_a_queued_tasks_wrapper_refuses_a_symlinked_attempts_dir_and_writes_nothing_through_it(tmp_path: Path):
    """Hostile test: with the run dir empty while queued, a symlink planted as attempts/ had the wrapper write the
    attempt's records, logs and exit record outside the runs root, then run the program."""
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "runs" / "t.0000"
    run.mkdir(parents=True)
    (run / "attempts").symlink_to(outside)
    argv = [PY, "-m", "orchestrator.jobside.wrapper", "--run-dir", str(run), "--job", "t.0000", "--attempt", "1",
            "--token", "tok", "--fence", "1", "--batch", "b" + "4" * 16, "--task", "0", "--",
            "sh", "-c", "echo ran > ran.txt"]
    p = subprocess.run(argv, cwd=run, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "refusing to write through" in p.stderr, (p.returncode, p.stderr)
    assert list(outside.iterdir()) == [] and not (run / "ran.txt").exists()
