"""The job wrapper never runs the program in a run dir whose done marker verifies (a Slurm rerun of a task that
had already finished: seen in CI as an in-place restart of a verified sweep task)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchestrator import protocol

ROOT = Path(__file__).resolve().parents[2]


def _wrapper(run_dir: Path, token: str, *command: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "orchestrator.jobside.wrapper", "--run-dir", str(run_dir), "--attempt", "1",
            "--token", token, "--job", run_dir.name, "--", *command]
    return subprocess.run(argv, cwd=str(ROOT), capture_output=True, text=True, timeout=60)


def test_a_verified_run_dir_is_never_run_again(tmp_path):
    rd = tmp_path / "job"
    (rd / "result").mkdir(parents=True)
    (rd / "result" / "out.txt").write_text("first\n")
    protocol.write_done_marker(rd, "job", 1, ["result/out.txt"])
    assert protocol.verify_done_marker(rd).verified
    p = _wrapper(rd, "t1", "sh", "-c", "echo second > result/out.txt; touch ran")
    assert p.returncode == 0, p.stderr
    assert not (rd / "ran").exists() and (rd / "result" / "out.txt").read_text() == "first\n"
    rec = json.loads((protocol.attempt_dir(rd, 1) / protocol.EXIT_FILE).read_text())
    assert rec["returncode"] == 0 and rec["error"].startswith("already complete"), rec
    # Without a verified marker the same wrapper runs the program.
    (rd / protocol.DONE_MARKER).unlink()
    assert _wrapper(rd, "t2", "sh", "-c", "touch ran").returncode == 0 and (rd / "ran").exists()
