"""The multi-rank kit's decisions, one at a time: the agreement's interval, the commit's refusals,
the controller's bounded verification, and the class a rank's failure gets. Real processes: tests/integrations/
test_multirank.py."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from orchestrator import protocol
from orchestrator.kit import dist as kdist
from orchestrator.kit.run import Run
from orchestrator.kit.sharded import _check_reports


class _Flag:
    requested = False


def _agreement(step_s: float, cost_s: float, max_interval_s: float = 1.0) -> kdist.StopAgreement:
    a = kdist.StopAgreement(_Flag(), max_interval_s=max_interval_s)
    a._step_s, a._cost_s = step_s, cost_s
    return a


def test_the_agreement_interval_keeps_its_cost_at_one_percent_of_the_step_time():
    assert _agreement(0.005, 0.001)._proposal() == 40  # 1 ms every 40 x 5 ms: 0.5 %, half the 1 % budget
    assert _agreement(1.0, 0.001)._proposal() == 1  # a long step: every step


def test_the_agreement_interval_never_exceeds_what_the_grace_allows():
    assert _agreement(0.5, 0.1, max_interval_s=1.0)._proposal() == 2  # cost alone would ask for 20 steps
    assert _agreement(3.0, 0.1, max_interval_s=1.0)._proposal() == 1


def test_the_longest_time_between_agreements_comes_from_the_env_and_a_tenth_of_the_grace():
    assert kdist.max_check_interval_s({}) == kdist.DEFAULT_STOP_CHECK_S
    assert kdist.max_check_interval_s({kdist.ENV_STOP_CHECK_S: "3"}) == 3.0
    assert kdist.max_check_interval_s({kdist.ENV_GRACE_S: "5"}) == 0.5
    assert kdist.max_check_interval_s({kdist.ENV_STOP_CHECK_S: "x", kdist.ENV_GRACE_S: "-1"}) == 1.0


def test_one_process_acts_on_its_own_flag_at_every_boundary():
    flag = _Flag()
    a = kdist.StopAgreement(flag)
    assert [a.should_stop() for _ in range(3)] == [False] * 3
    flag.requested = True
    assert a.should_stop() is True


def test_grad_accumulation_keeps_the_effective_batch_and_refuses_one_it_would_change():
    assert [kdist.grad_accumulation(8, 2, w) for w in (1, 2, 4)] == [4, 2, 1]
    with pytest.raises(ValueError, match="not a multiple"):
        kdist.grad_accumulation(8, 2, 3)


def _files(tmp: Path, name: str, data: bytes) -> dict:
    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp / name).write_bytes(data)
    return {name: {"size": len(data), "sha256": "x"}}


def test_rank_zero_commits_only_when_every_rank_reported_every_file_without_error(tmp_path):
    r0 = {"rank": 0, "files": {**_files(tmp_path, "dcp/.metadata", b"m"), **_files(tmp_path, "state.pt", b"s")}}
    r1 = {"rank": 1, "files": _files(tmp_path, "dcp/__1_0.distcp", b"abc")}
    assert _check_reports(tmp_path, [r0, r1], 2, True) is None
    assert "expected 0..1" in _check_reports(tmp_path, [r0, None], 2, True)  # a rank that never reported
    assert "rank 1: OSError" in _check_reports(tmp_path, [r0, {"rank": 1, "error": "OSError(28)"}], 2, True)
    assert "reported by two ranks" in _check_reports(tmp_path, [r0, {"rank": 1, "files": r0["files"]}], 2, True)
    (tmp_path / "dcp" / "__1_0.distcp").write_bytes(b"ab")  # shorter than reported
    assert "is not on disk with its size" in _check_reports(tmp_path, [r0, r1], 2, True)
    no_meta = {"rank": 0, "files": _files(tmp_path, "state.pt", b"s")}
    assert ".metadata was not written" in _check_reports(tmp_path, [no_meta], 1, True)


def _checkpoint(run_dir: Path, step: int, data: bytes, **extra: object) -> Path:
    d = run_dir / protocol.CHECKPOINTS_DIR / protocol.checkpoint_name(step)
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(data)
    listing = {"model.pt": {"size": len(data), "sha256": protocol.sha256_file(d / "model.pt")[1]}}
    (d / protocol.MANIFEST).write_text(json.dumps({"step": step, "files": listing, **extra}))
    return d


def _flip(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 1
    p.write_bytes(bytes(b))


def test_the_controller_hashes_only_small_single_writer_checkpoints(tmp_path):
    small = _checkpoint(tmp_path, 1, os.urandom(4096))
    sharded = _checkpoint(tmp_path, 2, os.urandom(4096), format=protocol.SHARDED_FORMAT)
    for d in (small, sharded):
        _flip(d / "model.pt")
    assert "sha256 mismatch" in protocol.verify_checkpoint_bounded(small)  # the sha256 check still catches it
    assert protocol.verify_checkpoint_bounded(sharded) is None  # its ranks hash it at resume
    assert protocol.verify_checkpoint_bounded(small, hash_budget=1024) is None  # too large to hash here
    (sharded / "model.pt").write_bytes(b"short")
    assert "has size 5" in protocol.verify_checkpoint_bounded(sharded)  # sizes are always checked


class _Gone(RuntimeError):
    pass


def test_a_rank_that_lost_a_peer_reports_killed_or_the_peers_own_crash(tmp_path):
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    run0 = Run(run_dir=tmp_path, job="j", attempt=1, is_writer=True)
    run1 = Run(run_dir=tmp_path, job="j", attempt=1, is_writer=False)
    run0.crashed(7, lost, "tb", rank=0, world=2)
    assert protocol.read_failure(tmp_path, 1)["class"] == "killed"
    run1.crashed(7, ValueError("bug"), "Traceback: ValueError: bug", rank=1, world=2)  # its own failure
    assert json.loads((protocol.attempt_dir(tmp_path, 1) / "failure.rank-00001.json").read_text())["class"] == "crash"
    run0.crashed(7, lost, "tb", rank=0, world=2)
    got = protocol.read_failure(tmp_path, 1)
    assert got["class"] == "crash" and "ValueError: bug" in got["detail"], got
    assert not kdist.lost_peer(RuntimeError("shape mismatch")) and not kdist.lost_peer(None)
    run0.crashed(3, _Gone("Connection closed by peer"), "tb", rank=0, world=1)  # one process: its own crash
    assert protocol.read_failure(tmp_path, 1)["class"] == "crash"


def test_a_write_error_class_follows_the_cause_chain_never_the_context():
    """One EIO in a checkpoint write was a counted crash. The kit's CheckpointError and the sharded
    commit's verdict raise ``from`` the OSError; an error raised while handling one is the code's own."""
    import errno

    from orchestrator.kit.checkpoint import CheckpointError

    eio, full, quota = OSError(errno.EIO, "eio"), OSError(errno.ENOSPC, "full"), OSError(errno.EDQUOT, "quota")
    assert [protocol.write_error_class(e) for e in (eio, full, quota, OSError(errno.EACCES, "no"), None,
                                                    ValueError("bug"))] == ["storage", "enospc", "enospc",
                                                                            "crash", "crash", "crash"]
    try:
        raise CheckpointError(4, eio, 0) from eio
    except CheckpointError as e:
        assert protocol.write_error_class(e) == "storage" and protocol.storage_errno(e) == errno.EIO
    try:
        try:
            raise eio
        except OSError:
            raise KeyError("a bug in the handler") from None
    except KeyError as e:
        assert protocol.write_error_class(e) == "crash"
    try:
        try:
            raise eio
        except OSError:
            raise KeyError("a bug in the handler")  # noqa: B904 - the implicit context is the point
    except KeyError as e:
        assert protocol.write_error_class(e) == "crash"


def test_a_rank_that_failed_on_storage_makes_the_attempt_storage_not_crash(tmp_path):
    """The writer's own EIO is storage; a peer's (its rank record) is passed on by the rank that lost it; a record
    with any other class, or a hostile one, is a crash."""
    import errno

    lost = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    run0 = Run(run_dir=tmp_path, job="j", attempt=1, is_writer=True)
    run1 = Run(run_dir=tmp_path, job="j", attempt=1, is_writer=False)
    run0.crashed(3, OSError(errno.EIO, "eio"), "tb", rank=0, world=1)
    assert protocol.read_failure(tmp_path, 1)["class"] == "storage"
    run1.crashed(7, OSError(errno.ESTALE, "stale"), "Traceback: OSError: stale", rank=1, world=2)
    rank1 = protocol.attempt_dir(tmp_path, 1) / "failure.rank-00001.json"
    assert json.loads(rank1.read_text())["class"] == "storage"
    run0.crashed(7, lost, "tb", rank=0, world=2)
    assert protocol.read_failure(tmp_path, 1)["class"] == "storage"
    for hostile in (["storage"], "killed", None):
        rank1.write_text(json.dumps({"class": hostile, "detail": "x"}))
        run0.crashed(7, lost, "tb", rank=0, world=2)
        assert protocol.read_failure(tmp_path, 1)["class"] == "crash", hostile


def test_settle_waits_until_no_other_thread_holds_an_agreement_tensor(monkeypatch):
    """A collective backend's thread that still holds the agreement's tensor when the program exits frees it
    during finalization and aborts the rank (SIGABRT after a completed run). settle() returns only once
    that reference is gone, and gives up (False) at its timeout rather than wait for ever."""
    import threading

    import torch

    monkeypatch.setattr(kdist, "_BUFFERS", {("cpu", 1): torch.zeros(1, dtype=torch.int64)})
    held = [kdist._BUFFERS[("cpu", 1)]]  # what gloo's worker holds until it drops the finished work
    go = threading.Event()

    def worker() -> None:
        go.wait(10)
        held.clear()

    t = threading.Thread(target=worker)
    t.start()
    assert kdist.settle(timeout_s=0.05) is False  # still held: bounded, not for ever
    go.set()
    assert kdist.settle(timeout_s=10) is True
    assert not held
    t.join()


def test_a_sharded_file_is_hashed_from_what_the_file_holds_after_its_fsync(tmp_path):
    from orchestrator.kit.sharded import _CountingStream, _fsync_and_hash

    path = tmp_path / "__0_0.distcp"
    payload = os.urandom(3 << 20)
    with open(path, "xb") as f:
        w = _CountingStream(f, None)
        w.write(memoryview(payload)[: 1 << 20])
        w.write(payload[1 << 20:])
        assert w.tell() == len(payload)
        digest = _fsync_and_hash(f, path, w.size)
    assert digest == hashlib.sha256(payload).hexdigest()


def test_a_sharded_file_that_grew_behind_the_writer_fails_its_save_instead_of_recording_a_wrong_size(tmp_path):
    # Hashing back from the file, not from the buffers written, is only honest if the file is what was written:
    # a second writer of the same path (or a truncation) is an error, never a manifest entry.
    from orchestrator.kit.sharded import _CountingStream, _fsync_and_hash

    path = tmp_path / "__0_0.distcp"
    with open(path, "xb") as f:
        w = _CountingStream(f, None)
        w.write(b"x" * 4096)
        f.flush()
        with open(path, "ab") as other:
            other.write(b"y")
        with pytest.raises(OSError, match="4097 bytes on disk after writing 4096"):
            _fsync_and_hash(f, path, w.size)
