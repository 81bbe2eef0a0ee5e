"""The public pieces any training script can use: CheckpointManager, PreemptionFlag, the heartbeat."""

from __future__ import annotations

import errno
import json
import os
import signal
import time

import pytest
import torch
from trainerkit import committed, tmp_entries

from orch_trainer.data import BatchSampler, generated_corpus
from orchestrator import protocol
from orchestrator.kit.checkpoint import CheckpointCorrupt, CheckpointError, CheckpointManager
from orchestrator.kit.heartbeat import Heartbeat
from orchestrator.kit.preemption import PreemptionFlag


def _state(v: float) -> dict:
    return {"model.pt": {"w": torch.full((64, 64), v)}, "meta.json": {"v": v}}


def test_save_commits_a_verified_checkpoint_that_loads(tmp_path):
    m = CheckpointManager(tmp_path, keep_last_k=2)
    path = m.save(7, _state(1.5))
    assert path == tmp_path / "checkpoints" / "step-00000007"
    assert protocol.verify_checkpoint(path) is None
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 7 and set(manifest["files"]) == {"model.pt", "meta.json"}
    loaded = m.load(path)
    assert torch.equal(loaded["model.pt"]["w"], torch.full((64, 64), 1.5))
    assert loaded["meta.json"] == {"v": 1.5}
    assert m.latest_verified() == (7, path)


def test_hash_is_computed_while_writing_and_matches_the_bytes_on_disk(tmp_path):
    big = {"model.pt": {f"w{i}": torch.randn(512, 1024) for i in range(6)}}  # 12 MB: several hash chunks
    path = CheckpointManager(tmp_path).save(1, big)
    listing = json.loads((path / "manifest.json").read_text())["files"]["model.pt"]
    assert (listing["size"], listing["sha256"]) == protocol.sha256_file(path / "model.pt")


def test_background_save_writes_the_state_as_it_was_when_save_was_called(tmp_path):
    m = CheckpointManager(tmp_path)
    w = torch.zeros(256, 256)
    assert m.save(1, {"model.pt": {"w": w}}, background=True) is None
    w.add_(1.0)  # the next training step changes the weights in place while the save runs
    step, path = m.wait()
    assert step == 1 and torch.equal(m.load(path)["model.pt"]["w"], torch.zeros(256, 256))


def test_failed_background_save_surfaces_removes_its_tmp_and_keeps_the_previous(tmp_path):
    def disk_full(step: int, path: str) -> None:
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device", path)
    m = CheckpointManager(tmp_path, keep_last_k=1, write_hook=disk_full)
    m.save(1, _state(1.0))
    m.save(2, _state(2.0), background=True)
    with pytest.raises(CheckpointError) as e:
        m.wait()
    assert e.value.step == 2 and e.value.cause.errno == errno.ENOSPC and e.value.bytes_needed >= 64 * 64 * 4
    assert committed(tmp_path) == ["step-00000001"] and tmp_entries(tmp_path) == []
    assert protocol.verify_checkpoint(tmp_path / "checkpoints" / "step-00000001") is None


def test_prune_keeps_the_newest_k_and_only_after_the_new_one_committed(tmp_path):
    m = CheckpointManager(tmp_path, keep_last_k=2)
    for s in (1, 2, 3, 4):
        m.save(s, _state(float(s)))
    assert committed(tmp_path) == ["step-00000003", "step-00000004"]
    assert tmp_entries(tmp_path) == []


def test_clean_stale_removes_tmp_entries_only(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(1, _state(1.0))
    root = tmp_path / "checkpoints"
    (root / f"step-00000002{protocol.TMP_INFIX}abcd").mkdir()
    (root / f"step-00000001{protocol.TMP_INFIX}del-abcd").mkdir()
    (root / "step-00000000.corrupt-abcd").mkdir()
    assert sorted(m.clean_stale()) == [f"step-00000001{protocol.TMP_INFIX}del-abcd",
                                       f"step-00000002{protocol.TMP_INFIX}abcd"]
    assert sorted(p.name for p in root.iterdir()) == ["step-00000000.corrupt-abcd", "step-00000001"]


def test_latest_verified_skips_and_reports_corrupt_and_load_refuses_them(tmp_path):
    m = CheckpointManager(tmp_path, keep_last_k=3)
    for s in (1, 2):
        m.save(s, _state(float(s)))
    bad = tmp_path / "checkpoints" / "step-00000002"
    (bad / "model.pt").write_bytes(b"x" * (bad / "model.pt").stat().st_size)
    seen = []
    found = m.latest_verified(on_corrupt=lambda p, why: seen.append((p.name, why)))
    assert found == (1, bad.with_name("step-00000001"))
    assert seen == [("step-00000002", "step-00000002: model.pt sha256 mismatch")]
    with pytest.raises(CheckpointCorrupt, match="sha256 mismatch"):
        m.load(bad)


def test_a_plain_torch_loop_adopts_the_api_in_a_few_lines(tmp_path):
    """What a user's own script needs: resume, save in the background, stop on SIGTERM, mark done."""
    def train(max_steps: int, stop_at: int | None = None) -> int:
        model, flag = torch.nn.Linear(4, 1), PreemptionFlag().install()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ckpts, start = CheckpointManager(tmp_path, keep_last_k=2), 0
        ckpts.clean_stale()
        if found := ckpts.latest_verified():
            state = ckpts.load(found[1])
            model.load_state_dict(state["model.pt"])
            opt.load_state_dict(state["optim.pt"])
            start = found[0]
        try:
            for step in range(start + 1, max_steps + 1):
                if step == stop_at:
                    os.kill(os.getpid(), signal.SIGTERM)
                if flag.requested:
                    ckpts.save(step - 1, {"model.pt": model.state_dict(), "optim.pt": opt.state_dict()})
                    return protocol.EXIT_PREEMPTED
                opt.zero_grad()
                model(torch.ones(2, 4)).pow(2).mean().backward()
                opt.step()
                state = {"model.pt": model.state_dict(), "optim.pt": opt.state_dict()}
                ckpts.save(step, state, background=True)
            ckpts.wait()
            torch.save(model.state_dict(), tmp_path / "model.pt")
            protocol.write_done_marker(tmp_path, "demo", 1, ["model.pt"])
            return 0
        finally:
            flag.uninstall()
    assert train(10, stop_at=6) == protocol.EXIT_PREEMPTED
    assert CheckpointManager(tmp_path).latest_verified()[0] == 5
    assert train(10) == 0 and protocol.verify_done_marker(tmp_path).verified


def test_preemption_flag_sigusr2_and_restores_previous_handler():
    prev = signal.getsignal(signal.SIGUSR2)
    with PreemptionFlag() as flag:
        assert not flag.requested
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.requested and flag.signum == signal.SIGUSR2 and flag.reason == "SIGUSR2"
    assert signal.getsignal(signal.SIGUSR2) == prev


def test_heartbeat_writes_only_fresh_progress(tmp_path):
    hb = Heartbeat(tmp_path, 1, interval_s=0.05).start()
    try:
        hb.post(step=1)
        time.sleep(0.3)
        first = protocol.read_progress(tmp_path, 1)
        assert first["step"] == 1
        time.sleep(0.3)  # nothing posted: the file must not be rewritten (a hang looks like a hang)
        assert protocol.read_progress(tmp_path, 1) == first
        hb.post(step=2)
    finally:
        hb.stop()
    assert protocol.read_progress(tmp_path, 1)["step"] == 2


def test_data_order_is_a_pure_function_of_seed_step_and_micro_batch():
    tokens = torch.frombuffer(bytearray(generated_corpus()), dtype=torch.uint8) % 96
    a, b = BatchSampler(tokens, 64, seed=5), BatchSampler(tokens, 64, seed=5)
    assert torch.equal(a.step_starts(17, 8), b.step_starts(17, 8))
    assert not torch.equal(a.step_starts(17, 8), a.step_starts(18, 8))
    assert not torch.equal(a.step_starts(17, 8), BatchSampler(tokens, 64, seed=6).step_starts(17, 8))
    starts = a.step_starts(3, 8)
    whole, _ = a.micro_batch(starts, 0, 8)
    halves = torch.cat([a.micro_batch(starts, j, 2)[0] for j in range(4)])
    assert torch.equal(whole, halves), "halving the micro-batch must keep the step's samples"
