"""The kit reports the time the loop was blocked saving: ``save_stall_s`` in every heartbeat (goodput)."""

from __future__ import annotations

import threading
import time

from orchestrator import protocol
from orchestrator.kit import stall
from orchestrator.kit.commit import commit_checkpoint
from orchestrator.kit.heartbeat import Heartbeat


def test_a_blocking_commit_is_counted_once_and_a_save_after_the_last_post_still_gets_a_beat(tmp_path):
    hb = Heartbeat(tmp_path, 1, interval_s=60)  # the thread never wakes by itself: only explicit writes
    hb.post(step=1, resumed_from=0)
    hb.write_now()

    def write(tmp):  # Lightning's trainer.save_checkpoint, slow; the nested section must not count twice
        with stall.blocked_saving():
            time.sleep(0.2)
        (tmp / "model.ckpt").write_bytes(b"x")

    t0 = time.monotonic()
    commit_checkpoint(tmp_path, 1, write=write)
    blocked = time.monotonic() - t0
    hb.stop()  # nothing posted since: the stall alone is worth one more beat (a preemption's last save)
    beats = protocol.read_progress_history(tmp_path, 1)
    assert beats[0]["save_stall_s"] == 0
    assert len(beats) == 2
    assert 0.2 <= beats[-1]["save_stall_s"] <= blocked


def test_another_threads_save_is_counted_but_a_later_heartbeat_starts_from_zero(tmp_path):
    t = threading.Thread(target=lambda: stall.add(0.5))
    t.start()
    t.join()
    hb = Heartbeat(tmp_path, 2, interval_s=60)  # a new attempt in the same process starts at 0
    hb.post(step=3)
    hb.write_now()
    assert protocol.read_progress(tmp_path, 2)["save_stall_s"] == 0


def test_a_background_save_stalls_the_loop_only_while_it_waits_for_it(tmp_path):
    import torch

    from orchestrator.kit.checkpoint import CheckpointManager

    ckpts = CheckpointManager(tmp_path, write_hook=lambda step, path: time.sleep(0.1))
    t0 = stall.total()
    ckpts.save(1, {"model.pt": torch.zeros(4), "meta.json": {"step": 1}}, background=True)
    assert stall.total() - t0 < 0.1  # the writer thread's sleeps are not the loop's
    ckpts.wait()  # now the loop blocks until the commit
    waited = stall.total() - t0
    assert waited >= 0.1
    ckpts.save(2, {"model.pt": torch.zeros(4)}, background=False)
    assert stall.total() - t0 - waited >= 0.1  # a synchronous save blocks for all of it, counted once
