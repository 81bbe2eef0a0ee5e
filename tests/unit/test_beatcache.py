"""The dashboard's incremental heartbeat reader (views/beatcache.py) answers exactly what a full read answers
(``goodputview.beats_of``), whatever happened to the file since its last read, while parsing only what is new."""

from __future__ import annotations

import json
import os
import random

import pytest

from orchestrator import protocol
from orchestrator.protocol import progress
from orchestrator.views import beatcache
from orchestrator.views.beatcache import BeatCache
from orchestrator.views.goodputview import beats_of

TAIL = 600  # a small tail, so that the histories here cross it


@pytest.fixture
def history(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "HISTORY_TAIL_BYTES", TAIL)
    adir = protocol.attempt_dir(tmp_path, 1)
    adir.mkdir(parents=True)
    return adir / protocol.PROGRESS_HISTORY


def _beat(step: int) -> bytes:
    return json.dumps({"time": 1000.0 + step, "step": step, "save_stall_s": 0.5}).encode() + b"\n"


def test_each_read_equals_a_full_read_through_appends_torn_lines_garbage_a_cut_tail_truncation_and_replacement(
        history, tmp_path):
    rnd = random.Random(7)
    cache = BeatCache()
    step = 0
    for i in range(400):
        op = rnd.choice(["beat", "beat", "beat", "beats", "torn", "garbage", "nothing", "big", "truncate",
                         "replace"] if i > 5 else ["beat"])
        data = history.read_bytes() if history.exists() else b""
        if op == "beat":
            step += 1
            data += _beat(step)
        elif op == "beats":
            for _ in range(rnd.randint(2, 30)):
                step += 1
                data += _beat(step)
        elif op == "torn":  # a line being written: then completed by the next append
            step += 1
            data += _beat(step)[:rnd.randint(1, 20)]
        elif op == "garbage":
            data += rnd.choice([b"not json\n", b"{}\n", b'{"step": "x"}\n', b"\n", b'{"time": 1e999, "step": 3}\n'])
        elif op == "big":  # more than the whole tail at once
            data += b"".join(_beat(step + k) for k in range(1, 40))
            step += 39
        elif op == "truncate":
            data = data[:rnd.randint(0, len(data))]
        if op == "replace":  # a new file under the same name (a new inode), same size
            tmp = history.with_suffix(".new")
            tmp.write_bytes(data[::-1] if rnd.random() < 0.5 else data)
            os.replace(tmp, history)
        elif op != "nothing":
            # torn lines are completed in place: rewrite keeps the inode
            with open(history, "r+b" if history.exists() else "wb") as f:
                f.write(data)
                f.truncate(len(data))
        assert cache.beats(str(tmp_path), 1) == beats_of(str(tmp_path), 1), (i, op)


def test_a_read_after_an_append_parses_only_the_new_lines(history, tmp_path, monkeypatch):
    history.write_bytes(b"".join(_beat(s) for s in range(1, 6)))
    cache = BeatCache()
    assert len(cache.beats(str(tmp_path), 1)) == 5
    parsed: list[bytes] = []
    real = progress.history_record
    monkeypatch.setattr(progress, "history_record", lambda line: parsed.append(line) or real(line))
    with open(history, "ab") as f:
        f.write(_beat(6) + _beat(7))
    assert [b.step for b in cache.beats(str(tmp_path), 1)] == [1, 2, 3, 4, 5, 6, 7]
    assert parsed == [_beat(6)[:-1], _beat(7)[:-1]]


def test_a_fifo_or_a_symlink_in_the_historys_place_is_no_history_and_never_blocks(history, tmp_path):
    cache = BeatCache()
    os.mkfifo(history)
    assert cache.beats(str(tmp_path), 1) == ()
    os.unlink(history)
    (tmp_path / "elsewhere").write_bytes(_beat(1))
    history.symlink_to(tmp_path / "elsewhere")
    assert cache.beats(str(tmp_path), 1) == ()


def test_full_it_keeps_the_cursors_still_read_and_reads_a_new_history_whole(tmp_path, monkeypatch):
    """Evicting the least recently read, a page that reads its rows in the same order each refresh would evict
    each cursor just before its next read: with 50 rows over the bound, every refresh read every history whole."""
    cache = BeatCache(max_beats=10)
    for n in (1, 2, 3):
        adir = protocol.attempt_dir(tmp_path, n)
        adir.mkdir(parents=True)
        (adir / protocol.PROGRESS_HISTORY).write_bytes(b"".join(_beat(s) for s in range(1, 5)))
    parsed: list[bytes] = []
    real = progress.history_record
    monkeypatch.setattr(progress, "history_record", lambda line: parsed.append(line) or real(line))
    for _refresh in range(3):  # rows 1, 2, 3 in order, as a page reads them
        for n in (1, 2, 3):
            assert len(cache.beats(str(tmp_path), n)) == 4
    assert cache._held <= 10 and sorted(cache._cursors) == [str(protocol.attempt_dir(tmp_path, n) /
                                                                protocol.PROGRESS_HISTORY) for n in (1, 2)]
    assert len(parsed) == 4 * 2 + 4 * 3  # rows 1 and 2 parsed once, row 3 on each refresh
    monkeypatch.setattr(beatcache.time, "monotonic", lambda: 1e12)  # no row read for a long time: stale
    assert len(cache.beats(str(tmp_path), 3)) == 4 and str(protocol.attempt_dir(tmp_path, 3) /
                                                              protocol.PROGRESS_HISTORY) in cache._cursors
    assert beatcache.MAX_BEATS_KEPT >= 500_000
