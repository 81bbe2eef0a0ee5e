"""Every rank's progress is observable (issue 19): rank 0 writes progress.json as ever, every other rank of a
multi-rank job its own small ``attempts/<n>/progress.rank-<r>.json``, only when its loop posted progress, so a
hung rank's file stops changing; a job that is not multi-rank gets no per-rank file."""

from __future__ import annotations

import json
import os

from orchestrator import protocol
from orchestrator.kit import heartbeat


def _names(run_dir) -> list[str]:  # noqa: ANN001
    d = protocol.attempt_dir(run_dir, 1)
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_rank_1_writes_its_own_step_only_and_only_after_a_post(tmp_path):
    hb = heartbeat.for_rank(tmp_path, 1, 3600, writer=False, rank=1, world=2)  # the thread never wakes by itself
    assert hb is not None
    try:
        hb.post(step=40, loss=0.5, max_steps=100)
        hb.write_now()
        path = protocol.attempt_dir(tmp_path, 1) / protocol.RANK_PROGRESS.format(1)
        assert _names(tmp_path) == [path.name]  # never rank 0's progress.json, no history
        rec = json.loads(path.read_text())
        assert (rec["rank"], rec["step"]) == (1, 40) and protocol.read_step(path) == 40
        os.utime(path, (1000.0, 1000.0))
        hb.write_now()  # nothing posted since: a hung rank's file must keep its age
        assert path.stat().st_mtime == 1000.0
        hb.post(step=41)
        hb.write_now()
        assert path.stat().st_mtime > 1000.0 and protocol.read_step(path) == 41
        assert list(protocol.progress_files(tmp_path, 1, 2)) == [0, 1]  # rank 0's path whether written or not
    finally:
        hb.stop()


def test_rank_0_and_a_one_process_job_write_progress_json_as_before(tmp_path):
    for writer, rank, world in ((True, 0, 2), (True, 0, 1)):
        run_dir = tmp_path / f"{rank}-{world}"
        hb = heartbeat.for_rank(run_dir, 1, 3600, writer=writer, rank=rank, world=world)
        assert hb is not None
        hb.post(step=7)
        hb.stop()
        assert _names(run_dir) == [protocol.PROGRESS_FILE, protocol.PROGRESS_HISTORY]
        progress = protocol.read_progress(run_dir, 1)
        assert progress["step"] == 7
        # rank 0 of several says so (the detector then reads the other ranks' files); one process: as before
        assert progress.get("world_size") == (2 if world == 2 else None), progress


def test_no_per_rank_file_when_the_world_is_one_rank(tmp_path):
    # RANK=1 without a process group of several ranks (a torchrun script that never called init): as today
    assert heartbeat.for_rank(tmp_path, 1, 3600, writer=False, rank=1, world=1) is None
    assert heartbeat.for_rank(tmp_path, 1, 3600, writer=False, rank=0, world=1) is None
