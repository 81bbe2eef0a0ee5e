"""SyncBatch: many atomic writes made durable by one flush (a sweep made 6,000 fsyncs).

The guarantee is atomic_write's: a final name only ever holds bytes that were flushed, and a failed
flush leaves nothing in place (no final name, no tmp file)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from orchestrator.protocol import durable
from orchestrator.protocol.durable import TMP_INFIX, SyncBatch


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_nothing_takes_its_final_name_before_commit_and_everything_does_after(tmp_path: Path) -> None:
    dirs = [tmp_path / f"t{i}" for i in range(3)]
    for d in dirs:
        d.mkdir()
    (dirs[0] / "fence.json").write_text('{"old": 1}')
    b = SyncBatch()
    for i, d in enumerate(dirs):
        b.write_json(d / "fence.json", {"i": i})
    assert len(b) == 3
    assert json.loads((dirs[0] / "fence.json").read_text()) == {"old": 1}  # the old content until commit
    assert not (dirs[1] / "fence.json").exists()
    b.commit()
    assert [json.loads((d / "fence.json").read_text()) for d in dirs] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert not [f for f in _files(tmp_path) if TMP_INFIX in f]


def test_a_failed_flush_leaves_neither_the_final_names_nor_tmp_files(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def full(paths: list[Path], dirs: bool = False) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable, "_flush", full)
    with pytest.raises(OSError) as e, SyncBatch() as b:
        b.write(tmp_path / "command.json", "{}")
        b.write(tmp_path / "fence.json", "{}")
    assert e.value.errno == errno.ENOSPC
    assert _files(tmp_path) == []


def test_an_error_while_writing_abandons_the_batch(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), SyncBatch() as b:
        b.write(tmp_path / "a.json", "{}")
        raise RuntimeError("the launcher failed before its backend call")
    assert _files(tmp_path) == []


def test_without_syncfs_each_file_and_directory_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(durable, "_SYNCFS", [None])
    monkeypatch.setattr(durable.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                         real(fd)))
    (tmp_path / "a").mkdir()
    with SyncBatch() as b:
        b.write(tmp_path / "a" / "x.json", "1")
        b.write(tmp_path / "y.json", "2")
    assert sum(TMP_INFIX in p for p in synced) == 2  # each file's bytes before its rename
    assert {str(tmp_path / "a"), str(tmp_path)} <= set(synced)  # each directory after the renames
    assert (tmp_path / "a" / "x.json").read_text() == "1"


def test_syncfs_is_found_on_linux() -> None:
    assert os.uname().sysname != "Linux" or durable._syncfs() is not None
