"""The cheap refusals: argument checks exit 2 before anything exists; a verified run is never touched."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from trainerkit import BASE_ARGS, ROOT, run_inproc, run_trainer, trainer_env, tree_state

from orchestrator import protocol


@pytest.mark.parametrize(("args", "message"), [
    (["--batch-size", "10", "--micro-batch-size", "4"],
     "--batch-size 10 must be a multiple of --micro-batch-size 4"),
    (["--batch-size", "4", "--micro-batch-size", "8"],
     "--batch-size 4 must be a multiple of --micro-batch-size 8"),
    (["--max-steps", "0"], "--max-steps: must be >= 1"),
    (["--lr", "0"], "--lr: must be a finite number > 0"),
    (["--lr", "nan"], "--lr: must be a finite number > 0"),
    (["--keep-last-k", "0"], "--keep-last-k: must be >= 1"),
    (["--skip-batches", "-1"], "--skip-batches: must be >= 0"),
    (["--sleep-per-step", "-1"], "--sleep-per-step: must be 0..3600"),
    (["--sleep-per-step", "nan"], "--sleep-per-step: must be 0..3600"),
    (["--inject-fault", "oom@5"], "malformed fault 'oom@5'"),
    (["--inject-fault", "boom@step=3"], "unknown fault kind 'boom'"),
    (["--inject-fault", "nan@step=0"], "fault step must be >= 1"),
    (["--resume", ""], "--resume must be auto, none or a checkpoint path"),
])
def test_argument_checks_exit_2_and_write_nothing(tmp_path, args, message):
    rd = tmp_path / "run"
    p = run_trainer(rd, *args)
    assert p.returncode == protocol.EXIT_USAGE, p.stderr
    assert message in p.stderr
    assert not rd.exists(), "an argument-only refusal must not create the run dir"


def test_lora_with_fork_checkpoint_refused_naming_both_flags(tmp_path):
    rd = tmp_path / "run"
    p = run_trainer(rd, "--lora-rank", "4", "--save-fork-checkpoint")
    assert p.returncode == protocol.EXIT_USAGE
    assert "--lora-rank" in p.stderr and "--save-fork-checkpoint" in p.stderr
    assert not rd.exists()


def test_missing_run_dir_is_a_usage_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "orch_trainer", "--max-steps", "3"], capture_output=True, text=True,
                       cwd=str(tmp_path), env=trainer_env(), timeout=60)
    assert p.returncode == protocol.EXIT_USAGE
    assert "--run-dir is required (or set ORCH_RUN_DIR)" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_documents_exit_codes():
    p = subprocess.run([sys.executable, "-m", "orch_trainer", "--help"], capture_output=True, text=True,
                       cwd=str(ROOT), env=trainer_env(), timeout=60)
    assert p.returncode == 0
    for line in ("0    finished", "2    usage error", "3    failure classified", "143  preempted"):
        assert line in p.stdout


def test_already_complete_prints_writes_nothing_exits_0(tmp_path):
    rd = tmp_path / "run"
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "4") == 0
    assert protocol.verify_done_marker(rd).verified
    before = tree_state(rd)
    # Even with another attempt number and a fault to inject: the marker decides, first.
    p = run_trainer(rd, *BASE_ARGS, "--max-steps", "4", "--inject-fault", "crash@step=1", attempt=2)
    assert p.returncode == 0, p.stderr
    assert "already complete" in p.stdout
    assert tree_state(rd) == before
    assert not protocol.attempt_dir(rd, 2).exists()


def test_corrupt_marker_is_not_complete_and_the_run_repairs_it(tmp_path):
    rd = tmp_path / "run"
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "4") == 0
    (rd / "result" / "model.pt").write_bytes(b"truncated")
    assert not protocol.verify_done_marker(rd).verified
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "4", attempt=2) == 0
    assert protocol.verify_done_marker(rd).verified


def scan_data(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orch_trainer", "scan-data", *args], capture_output=True,
                          text=True, cwd=str(ROOT), env=trainer_env(), timeout=60)


def test_scan_data_reports_bad_lines_with_numbers(tmp_path):
    corpus = tmp_path / "corpus.txt"
    lines = [b"a good line", b"another good one", b"bad utf8 \xff\xfe here", b"fine", b"x" * 20_000,
             b"fine again", "caf\u00e9 is not ascii".encode(), b"last"]
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    p = scan_data(str(corpus))
    assert p.returncode == 1
    out = p.stdout
    assert f"{corpus}:3: not valid UTF-8" in out
    assert f"{corpus}:5: absurdly long" in out
    assert f"{corpus}:7: cannot encode character U+00E9 at column 4" in out
    assert "8 lines, 3 bad" in out
    pj = scan_data("--json", str(corpus))
    assert [b["line"] for b in json.loads(pj.stdout)["bad_lines"]] == [3, 5, 7]
    clean = tmp_path / "clean.txt"
    clean.write_bytes(b"only\ngood lines\n")
    pc = scan_data(str(clean))
    assert pc.returncode == 0 and "2 lines, 0 bad" in pc.stdout


def test_loader_skips_and_counts_bad_lines_instead_of_crashing(tmp_path):
    from orch_trainer.data import generated_corpus
    corpus = tmp_path / "corpus.txt"
    good = generated_corpus().split(b"\n")
    corpus.write_bytes(b"\n".join(good[:50] + [b"\xff\xff broken", b"y" * 50_000] + good[50:]))
    rd = tmp_path / "run"
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "2", "--data", str(corpus)) == 0
    cfg = json.loads((rd / "run_config.json").read_text())
    assert cfg["data_lines_skipped"] == 2
    assert cfg["data_source"] == str(corpus)
