"""In-process claims of the shared runtime and of orch_run (no orch, a run_dir argument; fast)."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from orchkit import make_checkpoint

from orchestrator import protocol
from orchestrator.integrations.loop import orch_run
from orchestrator.kit.commit import commit_checkpoint
from orchestrator.kit.run import Run, RunDirError


def _fill(tmp, data: bytes = b"weights") -> None:
    (tmp / "model.bin").write_bytes(data)
    (tmp / "sub").mkdir()
    (tmp / "sub" / "state.json").write_text("{}")


def test_commit_checkpoint_writes_a_verified_step_dir_and_prunes_after_the_commit(tmp_path):
    for step in (1, 2, 3):
        path = commit_checkpoint(tmp_path, step, write=_fill, keep_last_k=2)
        assert protocol.verify_checkpoint(path) is None
    assert [s for s, _ in protocol.verified_checkpoints(tmp_path)] == [3, 2]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 3 and set(manifest["files"]) == {"model.bin", "sub/state.json"}
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if protocol.TMP_INFIX in p.name]


def test_commit_checkpoint_moves_a_framework_dir_and_a_failed_write_leaves_only_committed_ones(tmp_path):
    src = tmp_path / "hf-output" / "checkpoint-7"
    src.mkdir(parents=True)
    _fill(src)
    path = commit_checkpoint(tmp_path, 7, move_from=src)
    assert not src.exists() and protocol.verify_checkpoint(path) is None

    def dies(tmp) -> None:
        (tmp / "half.bin").write_bytes(b"x")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        commit_checkpoint(tmp_path, 8, write=dies)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000007"]


def test_resume_skips_a_checkpoint_that_does_not_verify_and_follows_a_rollback_override(tmp_path, monkeypatch):
    for step in (10, 20, 30):
        make_checkpoint(tmp_path, step, {"model.pt": bytes([step])})
    (tmp_path / "checkpoints" / "step-00000030" / "model.pt").write_bytes(b"torn")  # a kill mid-write
    assert Run.from_env(tmp_path).resume_checkpoint()[0] == 20
    monkeypatch.setenv(protocol.ENV_OVERRIDES, json.dumps({"resume": "checkpoints/step-00000010"}))
    assert Run.from_env(tmp_path).resume_checkpoint()[0] == 10
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names[0] == "step-00000010" and all(".abandoned-" in n for n in names[1:]), names


def test_a_rollback_override_that_does_not_verify_falls_back_to_an_older_verified_one(tmp_path, monkeypatch):
    # A NaN rollback target corrupted after orch's policy chose it raised RunDirError (the attempt
    # failed, then the job): it is set aside and the next OLDER verified checkpoint is used, never a newer one.
    for step in (5, 10, 15, 20):
        make_checkpoint(tmp_path, step, {"model.pt": bytes([step]) * 64})
    (tmp_path / "checkpoints" / "step-00000010" / "model.pt").write_bytes(b"\xff" * 64)  # same size, other bytes
    (tmp_path / "checkpoints" / "step-00000015" / "model.pt").write_bytes(b"\xfe" * 64)
    monkeypatch.setenv(protocol.ENV_OVERRIDES, json.dumps({"resume": "checkpoints/step-00000015"}))
    assert Run.from_env(tmp_path).resume_checkpoint() == (5, tmp_path / "checkpoints" / "step-00000005")
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names[0] == "step-00000005" and [n.split(".")[1].split("-")[0] for n in names[1:]] == \
        ["corrupt", "corrupt", "abandoned"], names
    # nothing older verifies: a fresh start, and nothing is left that could be resumed later by mistake
    (tmp_path / "checkpoints" / "step-00000005" / "model.pt").write_bytes(b"\xfd" * 64)
    monkeypatch.setenv(protocol.ENV_OVERRIDES, json.dumps({"resume": "checkpoints/step-00000005"}))
    assert Run.from_env(tmp_path).resume_checkpoint() is None
    assert not list(protocol.iter_checkpoint_dirs(tmp_path))
    # a path outside this run's checkpoints/ (another run's fork) is never replaced: still an error
    other = tmp_path / "elsewhere"
    make_checkpoint(other, 7, {"model.pt": b"x"})
    (other / "checkpoints" / "step-00000007" / "model.pt").write_bytes(b"y")
    monkeypatch.setenv(protocol.ENV_OVERRIDES, json.dumps({"resume": str(other / "checkpoints" / "step-00000007")}))
    with pytest.raises(RunDirError, match="sha256 mismatch|does not verify|size"):
        Run.from_env(tmp_path).resume_checkpoint()


def _train(run_dir, max_steps: int, signal_at: int | None = None, signum: int = signal.SIGUSR2) -> int:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        with orch_run(model, opt, save_every=3, run_dir=run_dir) as run:
            for step in run.steps(max_steps):
                if step == signal_at:
                    os.kill(os.getpid(), signum)
                opt.zero_grad()
                model(torch.randn(2, 4)).pow(2).mean().backward()
                opt.step()
    except SystemExit as e:
        return e.code
    return 0


def test_loop_sigusr2_time_limit_warning_checkpoints_the_step_in_flight_and_exits_143(tmp_path):
    assert _train(tmp_path, 10, signal_at=5) == protocol.EXIT_PREEMPTED
    report = protocol.read_failure(tmp_path, 1)
    assert (report["class"], report["step"], report["checkpoint"]) == ("preempted", 5, "checkpoints/step-00000005")
    assert "SIGUSR2" in report["detail"] and not (tmp_path / "done.json").exists()
    assert _train(tmp_path, 10) == 0 and protocol.verify_done_marker(tmp_path).verified
    assert _train(tmp_path, 10) == 0  # already complete: exits 0 ...
    assert protocol.read_json_bounded(tmp_path / "result" / "metrics.json")["resumed_from"] == 5  # ... untouched


def test_loop_signal_during_the_last_step_is_a_stop_and_the_next_run_only_finishes(tmp_path):
    # A stop is never completion, even one that came with the last step. That step is checkpointed
    # (exit 143, no marker); the next run has 0 steps left and only writes the result.
    assert _train(tmp_path, 6, signal_at=6, signum=signal.SIGTERM) == protocol.EXIT_PREEMPTED
    report = protocol.read_failure(tmp_path, 1)
    assert (report["class"], report["step"], report["checkpoint"]) == ("preempted", 6, "checkpoints/step-00000006")
    assert not (tmp_path / "done.json").exists()
    assert _train(tmp_path, 6) == 0 and protocol.verify_done_marker(tmp_path).verified
    assert protocol.read_json_bounded(tmp_path / "result" / "metrics.json")["resumed_from"] == 6


def test_loop_crash_is_reported_with_its_traceback_and_no_marker(tmp_path):
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ZeroDivisionError), orch_run(model, run_dir=tmp_path) as run:
        for step in run.steps(5):
            if step == 3:
                1 / 0  # noqa: B018
    report = protocol.read_failure(tmp_path, 1)
    assert report["class"] == "crash" and report["step"] == 2 and "ZeroDivisionError" in report["detail"]
    assert not (tmp_path / "done.json").exists()


def test_the_cli_imports_no_integration_and_no_framework():
    import subprocess
    import sys

    code = ("import sys, orchestrator.cli; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('lightning', 'transformers', 'torch', 'wandb') or m.startswith('orchestrator.integrations')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


ENV_DUMP = ("import json, os, pathlib; pathlib.Path('result').mkdir(); pathlib.Path('result/env.json').write_text("
            "json.dumps({k: os.environ.get(k) for k in ('ORCH_RUN_ID', 'WANDB_RUN_ID', 'WANDB_RESUME', "
            "'WANDB_NAME', 'WANDB_TAGS', 'WANDB_RUN_GROUP', 'ORCH_TENSORBOARD_DIR', 'ORCH_RUN_DIR')}))")


def test_every_attempt_gets_one_tracker_id_and_one_tensorboard_dir(orch):
    import sys

    orch("submit", "--name", "envjob", "--outputs", "result/*", "--wait", "--", sys.executable, "-c", ENV_DUMP,
         check=True)
    run_dir = orch.runs / "envjob"
    env = json.loads((run_dir / "result" / "env.json").read_text())
    assert env == {"ORCH_RUN_ID": protocol.stable_run_id(run_dir, "envjob"), "WANDB_RUN_ID": env["ORCH_RUN_ID"],
                   "WANDB_RESUME": "allow", "WANDB_NAME": "envjob", "WANDB_TAGS": "orch.job:envjob",
                   "WANDB_RUN_GROUP": None, "ORCH_TENSORBOARD_DIR": str(run_dir / "tensorboard"),
                   "ORCH_RUN_DIR": str(run_dir)}
