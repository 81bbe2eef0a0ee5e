"""Done means the program exited 0 after completing; a stop from anywhere is never completion.

Real frameworks (examples/), real signals, the real CLI on the local backend:

* an exception right after training (a failed export) is a crash: never verified, ``submit --wait`` exits 4,
  ``orch show`` says crash, whatever the integration wrote when training ended;
* files the script writes into result/ after training are listed in done.json;
* a SIGTERM straight to the PROGRAM (never through orch's wrapper, as a user's kill or a container stop
  delivers it) is recorded by the kit (``attempts/<n>/stop.json``); the attempt is never verified, is
  requeued by ``orch reconcile`` and resumes with 0 steps redone;
* a program with orch's kit that exits 0 after a stop it received directly is never verified.
"""

from __future__ import annotations

import json
import sys

import pytest
from intkit import DONE, attempts, example, failure, preempt, repeats, step_log
from orchkit import wait_for

from orchestrator import protocol

EXIT_NOT_VERIFIED = 4
FRAMEWORKS = [
    ("loop", "plain_loop.py", ["--max-steps", "8", "--save-every", "4"]),
    ("lit", "lightning_train.py", ["--max-steps", "8"]),
    ("hf", "hf_train.py", ["--max-steps", "8"]),
]


@pytest.mark.parametrize(("name", "script", "args"), FRAMEWORKS, ids=[f[0] for f in FRAMEWORKS])
def test_exception_after_training_is_a_crash_never_verified(orch, name, script, args):
    p = orch("submit", "--wait", "--name", name, "--", *example(script, *args, "--fail-after-train"), timeout=300)
    run_dir = orch.runs / name
    assert p.returncode == EXIT_NOT_VERIFIED, p.stdout + p.stderr
    assert not protocol.verify_done_marker(run_dir).verified and not (run_dir / protocol.DONE_MARKER).exists()
    first = attempts(orch, name)[0]
    assert (first["failure_class"], first["exit_code"]) == ("crash", 1), first
    assert orch.state(name) != DONE
    # Training did complete (the record says so), which is exactly what must not be taken for "done".
    assert (protocol.attempt_dir(run_dir, 1) / protocol.COMPLETE_FILE).exists()
    shown = orch("show", name).stdout
    assert "succeeded" not in shown and "crash" in shown, shown


@pytest.mark.parametrize(("name", "script", "args"), FRAMEWORKS, ids=[f[0] for f in FRAMEWORKS])
def test_files_written_after_training_are_listed_in_the_marker(orch, name, script, args):
    p = orch("submit", "--wait", "--name", name, "--", *example(script, *args, "--export"), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    v = protocol.verify_done_marker(orch.runs / name)
    assert v.verified and "result/export.txt" in v.marker["artifacts"], v


SIGTERMED = [
    ("loop", "plain_loop.py", ["--max-steps", "60", "--save-every", "1000", "--sleep-per-step", "0.05"]),
    ("lit", "lightning_train.py", ["--max-steps", "60", "--sleep-per-step", "0.05"]),
    ("hfjit", "hf_train.py", ["--max-steps", "60", "--sleep-per-step", "0.05", "--jit-checkpoint"]),
]


@pytest.mark.parametrize(("name", "script", "args"), SIGTERMED, ids=[f[0] for f in SIGTERMED])
def test_sigterm_to_the_program_alone_is_recorded_never_verified_and_resumed(orch, tmp_path, name, script, args):
    log = tmp_path / "steps.log"
    orch("submit", "--name", name, "--", *example(script, *args, "--step-log", str(log)), check=True)
    run_dir = orch.runs / name
    preempt(orch, name, script, 1, 5)  # os.kill(program pid): the wrapper never sees this signal
    adir = protocol.attempt_dir(run_dir, 1)
    wait_for((adir / protocol.EXIT_FILE).exists, 120, "attempt 1 to end")
    stop = json.loads((adir / protocol.STOP_FILE).read_text())
    assert stop["signal"] == "TERM" and stop["step"] == failure(run_dir, 1)["step"], stop
    assert protocol.read_exit(adir).stop_signal is None  # nothing passed through orch's wrapper
    assert not protocol.verify_done_marker(run_dir).verified
    assert orch.wait(name, {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show(name)
    shown = attempts(orch, name)
    assert [(a["failure_class"], (a["action"] or {}).get("auto")) for a in shown[:1]] == [("preempted", True)], shown
    assert len(shown) == 2 and shown[1]["state"] == "succeeded", shown
    steps = step_log(log)
    assert repeats(steps) == 0 and sorted(s for _, s in steps) == list(range(1, 61)), steps


EXIT_0_AFTER_STOP = """
import os, signal, time
from orchestrator.kit.preemption import PreemptionFlag
from orchestrator.kit.run import Run
flag = PreemptionFlag().install()
if os.environ["ORCH_ATTEMPT"] == "1":
    os.kill(os.getpid(), signal.SIGTERM)   # as a container stop would: straight to the program
    while not flag.requested:
        time.sleep(0.01)
Run.from_env().finish({"step": 3})         # a framework that saves and exits 0 on SIGTERM (HF JIT, Lightning)
flag.uninstall()
"""


def test_program_with_the_kit_that_exits_0_after_a_stop_is_never_verified(orch):
    # Attempt 1 gets the signal, "saves" and exits 0; attempt 2 runs unstopped.
    p = orch("submit", "--wait", "--name", "exit0", "--", sys.executable, "-c", EXIT_0_AFTER_STOP, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    first, second = attempts(orch, "exit0")
    assert (first["failure_class"], first["exit_code"], first["state"]) == ("preempted", 0, "failed"), first
    assert "stop.json" in first["detail"], first
    assert second["state"] == "succeeded" and protocol.verify_done_marker(orch.runs / "exit0").marker["attempt"] == 2


TRAINER_THEN = '"$0" -m orch_trainer --preset tiny --max-steps 6 --heartbeat-interval 0.1 && {then}'


def test_bundled_trainer_then_a_failing_export_is_a_crash_never_verified(orch):
    # A shell pipeline: the bundled trainer completes, then the user's export fails (exit 1).
    p = orch("submit", "--wait", "--name", "trx", "--", "sh", "-c",
             TRAINER_THEN.format(then="echo export failed >&2 && exit 1"), sys.executable, timeout=200)
    run_dir = orch.runs / "trx"
    assert p.returncode == EXIT_NOT_VERIFIED, p.stdout + p.stderr
    assert not (run_dir / protocol.DONE_MARKER).exists()
    first = attempts(orch, "trx")[0]
    assert (first["failure_class"], first["exit_code"]) == ("crash", 1), first
    assert (protocol.attempt_dir(run_dir, 1) / protocol.COMPLETE_FILE).exists()


def test_bundled_trainer_then_an_export_into_result_is_listed(orch):
    p = orch("submit", "--wait", "--name", "trok", "--", "sh", "-c",
             TRAINER_THEN.format(then="echo exported > result/export.txt"), sys.executable, timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    v = protocol.verify_done_marker(orch.runs / "trok")
    assert v.verified and {"result/export.txt", "result/model.pt", "result/metrics.json"} <= set(v.marker["artifacts"])


STOP_IN_LAST_STEP = """
import os, signal, torch
from orchestrator.integrations.loop import orch_run
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with orch_run(model, opt, save_every=None) as run:
    for step in run.steps(3):
        with open("steps.log", "a") as f:
            f.write(f"{os.environ['ORCH_ATTEMPT']} {step}\\n")
        if step == 3 and os.environ["ORCH_ATTEMPT"] == "1":
            os.kill(os.getpid(), signal.SIGTERM)   # during the last step: it stopped nothing, but it is a stop
"""


def test_a_stop_during_the_last_step_is_a_stop_and_the_next_attempt_only_finishes(orch):
    p = orch("submit", "--wait", "--name", "last", "--", sys.executable, "-c", STOP_IN_LAST_STEP, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    first, second = attempts(orch, "last")
    assert (first["failure_class"], first["exit_code"]) == ("preempted", 143), first
    assert failure(orch.runs / "last", 1)["checkpoint"] == "checkpoints/step-00000003"
    assert step_log(orch.runs / "last" / "steps.log") == [(1, 1), (1, 2), (1, 3)]  # attempt 2: 0 steps
    assert second["state"] == "succeeded"


AFTER = [
    ("loop", "plain_loop.py", ["--max-steps", "12", "--save-every", "5"]),
    ("lit", "lightning_train.py", ["--max-steps", "12"]),
    ("hf", "hf_train.py", ["--max-steps", "12"]),
]


@pytest.mark.parametrize(("name", "script", "args"), AFTER, ids=[f[0] for f in AFTER])
def test_a_failed_export_fixed_and_requeued_retrains_no_step(orch, tmp_path, name, script, args):
    """After an exception after training (a failed export: a crash, never verified), the fix and
    `orch requeue`, Lightning and HF retrained from scratch (150 of 150 steps), the loop from its last periodic
    save. Each integration commits the final step before it records completion: attempt 2 trains 0 steps."""
    log, broken = tmp_path / "steps.log", tmp_path / "export.broken"
    broken.touch()
    cmd = " ".join(example(script, *args, "--step-log", str(log)))
    orch("submit", "--name", name, "--", "sh", "-c", f'exec {cmd} $([ -e {broken} ] && echo --fail-after-train)',
         check=True)
    assert orch.wait(name, {"retryable_failed", "failed", DONE}, timeout=240) != DONE
    assert attempts(orch, name)[0]["failure_class"] == "crash"
    broken.unlink()  # the fix
    assert orch("requeue", name).returncode == 0
    assert orch.wait(name, {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show(name)
    steps = step_log(log)
    assert sorted(s for a, s in steps if a == 1) == list(range(1, 13)) and [s for a, s in steps if a == 2] == [], steps
    assert orch("verify", name).stdout == "VERIFIED\n"


def test_the_bundled_trainer_then_a_failed_export_fixed_and_requeued_retrains_no_step(orch, tmp_path):
    """The bundled trainer: its last step is committed before it records completion (6 steps, and a
    save every 10 by default: it retrained all 6)."""
    broken = tmp_path / "export.broken"
    broken.touch()
    orch("submit", "--name", "trfix", "--", "sh", "-c", TRAINER_THEN.format(then=f"! [ -e {broken} ]"),
         sys.executable, check=True)
    assert orch.wait("trfix", {"retryable_failed", "failed", DONE}, timeout=200) != DONE
    broken.unlink()  # the fix
    assert orch("requeue", "trfix").returncode == 0
    assert orch.wait("trfix", {DONE, "failed", "cancelled"}, timeout=200) == DONE, orch.show("trfix")
    second = attempts(orch, "trfix")[1]
    metrics = json.loads((orch.runs / "trfix" / "result" / "metrics.json").read_text())
    assert (metrics["attempt"], metrics["resumed_from_step"], metrics["steps"]) == (2, 6, 6), (metrics, second)
