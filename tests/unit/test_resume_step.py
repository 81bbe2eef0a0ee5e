"""The resume step a program is told (``ORCH_RESUME_STEP``), and the TensorBoard purge that makes a
resumed attempt's points replace what a killed attempt logged after it. End to end (three frameworks, kill -9,
TensorBoard's own reader): tests/integrations/test_tracker_curves.py; the wrapper's export: tests/local."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import protocol
from orchestrator.kit import tbpurge
from orchestrator.kit.commit import commit_checkpoint


def _commit(run_dir: Path, step: int) -> Path:
    return commit_checkpoint(run_dir, step, write=lambda d: (d / "w.bin").write_bytes(b"x" * 64))


def test_a_first_attempt_resumes_from_0_and_a_later_one_without_checkpoints_is_unknown(tmp_path):
    assert protocol.expected_resume_step(tmp_path, 1, {}) == 0
    # A later attempt with no checkpoint in orch's layout may be a program with its own: orch cannot tell.
    assert protocol.expected_resume_step(tmp_path, 2, {}) is None


def test_the_newest_committed_checkpoint_whose_sizes_verify_is_the_resume_step(tmp_path):
    _commit(tmp_path, 10)
    newest = _commit(tmp_path, 20)
    assert protocol.expected_resume_step(tmp_path, 3, {}) == 20
    (newest / "w.bin").write_bytes(b"x" * 63)  # torn: the kit would set it aside and resume from 10
    assert protocol.expected_resume_step(tmp_path, 3, {}) == 10


def test_a_rollback_names_its_target_and_a_fresh_start_is_0(tmp_path):
    _commit(tmp_path, 10)
    _commit(tmp_path, 20)
    assert protocol.expected_resume_step(tmp_path, 3, {"resume": "checkpoints/step-00000010"}) == 10
    assert protocol.expected_resume_step(tmp_path, 3, {"resume": "none"}) == 0


def test_the_purge_event_is_the_one_tensorboards_writer_encodes():
    event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")
    start = event_pb2.Event(wall_time=1.5, step=7, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
    assert tbpurge._event(1.5, 7, session_start=True) == start.SerializeToString()
    version = event_pb2.Event(wall_time=2.0, step=300, file_version="brain.Event:2")
    assert tbpurge._event(2.0, 300, file_version="brain.Event:2") == version.SerializeToString()
    assert tbpurge.crc32c(b"123456789") == 0xE3069283  # CRC-32C's check value


def test_nothing_is_written_where_no_earlier_attempt_logged(tmp_path):
    assert tbpurge.write_purge(tmp_path, 5, 2) is None
    assert tbpurge.write_purge(tmp_path / "absent", 5, 2) is None
    assert list(tmp_path.iterdir()) == []
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    (tmp_path / "tb").symlink_to(outside)  # a symlinked log dir could point anywhere: nothing is written there
    assert tbpurge.write_purge(tmp_path / "tb", 5, 2) is None
    assert [p.name for p in outside.iterdir()] == ["events.out.tfevents.1.host.1.0"]


EARLIER_ATTEMPT = """
import sys
from torch.utils.tensorboard import SummaryWriter
w = SummaryWriter(sys.argv[1])
for s in range(1, 31):
    w.add_scalar("loss", float(s), s)
w.close()
"""

RESUMED_ATTEMPT = """
import sys
from pathlib import Path
from torch.utils.tensorboard import SummaryWriter
from orchestrator.kit import tbpurge
w = SummaryWriter(sys.argv[1])  # opened before the purge, as HF's callback and Lightning's logger do
print(tbpurge.write_purge(Path(sys.argv[1]), 21, 2).name)
for s in range(21, 41):
    w.add_scalar("loss", 100.0 + s, s)
w.close()
"""


def test_tensorboard_shows_the_resumed_attempts_points_after_the_purge_and_the_earlier_ones_before(tmp_path):
    """The purge file sorts after the earlier process's event file and before every file of the process that wrote
    it, whenever that process made its writers (here: before the purge)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    subprocess.run([sys.executable, "-c", EARLIER_ATTEMPT, str(tmp_path)], check=True, capture_output=True)
    # Dated as an attempt that ended before orch's back-off (>= 1 s) and this attempt's start: as a real one is.
    (earlier,) = tmp_path.iterdir()
    parts = earlier.name.split(".")
    parts[3] = f"{int(parts[3]) - 5:010d}"
    earlier.rename(tmp_path / ".".join(parts))
    p = subprocess.run([sys.executable, "-c", RESUMED_ATTEMPT, str(tmp_path)], check=True, capture_output=True,
                       text=True)
    assert p.stdout.strip().endswith(".orch-resume-2"), p.stdout
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == \
        [(s, float(s)) for s in range(1, 21)] + [(s, 100.0 + s) for s in range(21, 41)]
