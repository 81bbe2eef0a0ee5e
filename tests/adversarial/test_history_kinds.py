"""Hostile pass 4: the heartbeat history ``attempts/<n>/progress.jsonl`` is a file the job's own
tree can replace. A directory there made `orch report`, `orch metrics`, `orch show` and `orch plot` exit 1
(IsADirectoryError) for every job; a FIFO there blocked the kit's heartbeat thread in open() for good, so
progress.json froze while training went on and the job was stopped as hung (an attempt counted)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from orchkit import wait_for

from orchestrator import protocol

KINDS = ("fifo", "directory", "symlink")


def _replace(path: Path, kind: str, elsewhere: Path) -> None:
    """``path`` replaced by a FIFO, a directory, or a symlink to a (regular) file outside the run dir."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        elsewhere.write_text('{"time": 1, "step": 999}\n')
        path.symlink_to(elsewhere)


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_history_file_is_read_as_none_and_never_raises(tmp_path, kind):
    history = protocol.attempt_dir(tmp_path, 1) / protocol.PROGRESS_HISTORY
    history.parent.mkdir(parents=True)
    _replace(history, kind, tmp_path / "elsewhere.jsonl")
    assert protocol.read_progress_history(tmp_path, 1) == []
    assert protocol.read_history_head(tmp_path, 1) is None


@pytest.mark.parametrize("kind", KINDS)
def test_a_heartbeat_still_lands_in_progress_json_and_never_blocks_on_a_bad_history(tmp_path, kind):
    history = protocol.attempt_dir(tmp_path, 1) / protocol.PROGRESS_HISTORY
    history.parent.mkdir(parents=True)
    _replace(history, kind, tmp_path / "elsewhere.jsonl")
    out: dict = {}

    def beat() -> None:
        try:
            protocol.write_progress(tmp_path, 1, step=7)
        except OSError as e:
            out["error"] = e

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "a heartbeat blocked on a FIFO named progress.jsonl"
    assert isinstance(out.get("error"), OSError)  # the kit's heartbeat logs it and goes on
    assert protocol.read_progress(tmp_path, 1)["step"] == 7  # what the hang judge reads
    if kind == "symlink":
        assert (tmp_path / "elsewhere.jsonl").read_text() == '{"time": 1, "step": 999}\n'  # never written through


@pytest.mark.parametrize("kind", KINDS)
def test_read_commands_over_a_bad_history_exit_0_for_every_job(orch, tmp_path, kind):
    orch("submit", "--name", "bad", "--", "sleep", "300", check=True)
    orch("submit", "--name", "ok", "--", "true", check=True)
    attempt = protocol.attempt_dir(orch.runs / "bad", 1)
    wait_for(lambda: (attempt / protocol.WRAPPER_FILE).exists(), 60, "the job's wrapper to start")
    _replace(attempt / protocol.PROGRESS_HISTORY, kind, tmp_path / "elsewhere.jsonl")
    try:
        for args in (("report", "--since", "all"), ("report", "--since", "all", "--json"), ("metrics",),
                     ("show", "bad"), ("show", "bad", "--json"), ("show", "bad", "--events"),
                     ("plot", "bad", "--json"), ("status",)):
            p = orch(*args, timeout=60)
            assert p.returncode == 0 and "Traceback" not in p.stderr, (args, p.returncode, p.stderr[-2000:])
    finally:
        orch("cancel", "bad")


def test_a_directory_at_a_ranks_heartbeat_file_leaves_no_tmp_file_per_beat(tmp_path):
    """Hostile pass 4: a directory at progress.rank-<r>.json failed every beat's rename and left its tmp file: one
    more file in the attempt dir per heartbeat."""
    adir = protocol.attempt_dir(tmp_path, 1)
    (adir / protocol.RANK_PROGRESS.format(1)).mkdir(parents=True)
    for step in range(3):
        with pytest.raises(OSError):
            protocol.write_rank_progress(tmp_path, 1, 1, step)
    assert sorted(p.name for p in adir.iterdir()) == [protocol.RANK_PROGRESS.format(1)]
