"""The wrapper's end-of-run marker decision: done.json only after exit 0 of a program that completed
(its kit's completion record, or --outputs) and was never stopped, from anywhere; a program's own done.json
followed by a failure or a stop is set aside; no TERM is ever followed by a marker. Real wrapper, real
processes and signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from orchkit import wait_for

from orchestrator import protocol

ROOT = Path(__file__).resolve().parents[2]


def _argv(run_dir: Path, token: str, *command: str, outputs: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "orchestrator.jobside.wrapper", "--run-dir", str(run_dir), "--attempt", "1",
            "--token", token, "--job", run_dir.name, *(a for o in outputs for a in ("--outputs", o)), "--", *command]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


def _wrapper(run_dir: Path, token: str, *command: str, outputs: tuple[str, ...] = ()) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(_argv(run_dir, token, *command, outputs=outputs), cwd=str(ROOT), capture_output=True,
                       text=True, timeout=60, env=_env())
    rec = json.loads((protocol.attempt_dir(run_dir, 1) / protocol.EXIT_FILE).read_text())
    assert rec["returncode"] == p.returncode or p.returncode > 128, (p.returncode, rec, p.stderr)
    return rec


def _py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


OWN_MARKER_THEN_EXIT_1 = """
import pathlib, sys
from orchestrator import protocol
pathlib.Path("result").mkdir(); pathlib.Path("result/out.txt").write_text("half")
protocol.write_done_marker(".", "j", 1, ["result/out.txt"])   # a callback's own marker, the old way
sys.exit(1)                                                   # ... then the export raised
"""


def test_own_marker_then_exit_1_is_set_aside_and_never_verified(tmp_path):
    rd = tmp_path / "j"
    rec = _wrapper(rd, "t1", *_py(OWN_MARKER_THEN_EXIT_1))
    assert rec["returncode"] == 1
    assert not (rd / protocol.DONE_MARKER).exists() and not protocol.verify_done_marker(rd).verified
    assert (rd / "done.rejected-1.json").exists()
    assert rec["marker_set_aside"].startswith("done.rejected-1.json") and "exited 1" in rec["marker_set_aside"], rec


COMPLETE_THEN_EXPORT = """
import os, pathlib
from orchestrator.kit.run import Run
assert os.environ["ORCH_MARKER_WRITER"] == "wrapper"
Run.from_env().finish({"loss": 1.0}, step=7)                 # training completed: the record, no marker
assert not pathlib.Path("done.json").exists()
pathlib.Path("result/export.onnx").write_text("exported after training")
pathlib.Path("out").mkdir(); pathlib.Path("out/extra.txt").write_text("x")
"""


def test_completion_record_and_exit_0_get_a_marker_listing_what_exists_at_exit(tmp_path):
    rd = tmp_path / "j"
    rec = _wrapper(rd, "t1", *_py(COMPLETE_THEN_EXPORT), outputs=("out/*",))
    assert rec["returncode"] == 0 and rec["marker_error"] is None, rec
    v = protocol.verify_done_marker(rd)
    assert v.verified and set(v.marker["artifacts"]) == {"result/metrics.json", "result/export.onnx",
                                                         "out/extra.txt"}, v
    record = json.loads((protocol.attempt_dir(rd, 1) / protocol.COMPLETE_FILE).read_text())
    assert (record["token"], record["step"], record["outputs"][0]) == ("t1", 7, "result/"), record


def test_completion_record_of_another_token_is_not_completion(tmp_path):
    rd = tmp_path / "j"
    code = ("import pathlib; from orchestrator import protocol; pathlib.Path('result').mkdir(); "
            "pathlib.Path('result/m.txt').write_text('x'); protocol.write_completion('.', 1, 'other', 3, [])")
    rec = _wrapper(rd, "t1", *_py(code))
    assert rec["returncode"] == 0 and not (rd / protocol.DONE_MARKER).exists(), rec


STOPPED_THEN_EXIT_0 = """
import os, pathlib, signal, time
from orchestrator.kit.preemption import PreemptionFlag
flag = PreemptionFlag().install()
pathlib.Path("result").mkdir(); pathlib.Path("result/half.txt").write_text("93 of 200 steps")
os.kill(os.getpid(), signal.SIGTERM)     # straight to the program: the wrapper never sees it
while not flag.requested:
    time.sleep(0.01)
flag.record_step(93)
flag.uninstall()                          # then "saves" and exits 0, as HF's JIT checkpoint does
"""


def test_a_stop_the_program_recorded_refuses_the_marker_whatever_the_exit(tmp_path):
    rd = tmp_path / "j"
    rec = _wrapper(rd, "t1", *_py(STOPPED_THEN_EXIT_0), outputs=("result/*",))
    assert rec["returncode"] == 0 and rec["stop_signal"] is None, rec
    assert not (rd / protocol.DONE_MARKER).exists() and "stop.json" in rec["marker_error"], rec
    stop = protocol.read_stop(protocol.attempt_dir(rd, 1), "t1")
    assert (stop.signal, stop.step) == ("TERM", 93), stop


def test_a_term_to_the_wrapper_while_it_writes_the_marker_undoes_it(tmp_path):
    # A VM shutdown signals every process: the TERM can reach the wrapper just after the program exited 0.
    rd = tmp_path / "j"
    rd.mkdir()
    gate = tmp_path / "gate"
    env = _env(ORCH_PAUSE_AT="wrapper_marker_decided", ORCH_PAUSE_UNTIL=str(gate), ORCH_PAUSE_S="60")
    w = subprocess.Popen(_argv(rd, "t1", "sh", "-c", "mkdir -p result && echo done > result/out.txt",
                               outputs=("result/*",)), cwd=str(ROOT), env=env)
    try:
        deadline_wait(lambda: Path(str(gate) + ".reached").exists(), w)
        assert protocol.verify_done_marker(rd).verified  # the window: the marker is written, exit.json is not
        os.kill(w.pid, signal.SIGTERM)
        gate.touch()
        assert w.wait(timeout=30) == 0
    finally:
        if w.poll() is None:
            w.kill()
    rec = json.loads((protocol.attempt_dir(rd, 1) / protocol.EXIT_FILE).read_text())
    assert not (rd / protocol.DONE_MARKER).exists() and (rd / "done.rejected-1.json").exists(), rec
    assert rec["stop_signal"] == "TERM" and rec["marker_error"].startswith("set aside"), rec


def test_a_term_after_the_decision_is_held_and_exit_json_agrees_with_the_marker(tmp_path):
    # Stops are blocked from the program's exit to exit.json: one that comes after the marker decision is
    # neither a reason to keep a marker nor recorded beside one (exit.json never says "stopped" next to a
    # marker that stands).
    rd = tmp_path / "j"
    rd.mkdir()
    gate = tmp_path / "gate"
    env = _env(ORCH_PAUSE_AT="wrapper_end_decided", ORCH_PAUSE_UNTIL=str(gate), ORCH_PAUSE_S="60")
    w = subprocess.Popen(_argv(rd, "t1", "sh", "-c", "mkdir -p result && echo done > result/out.txt",
                               outputs=("result/*",)), cwd=str(ROOT), env=env)
    try:
        deadline_wait(lambda: Path(str(gate) + ".reached").exists(), w)
        os.kill(w.pid, signal.SIGTERM)
        gate.touch()
        w.wait(timeout=30)
    finally:
        if w.poll() is None:
            w.kill()
    rec = json.loads((protocol.attempt_dir(rd, 1) / protocol.EXIT_FILE).read_text())
    assert protocol.verify_done_marker(rd).verified and rec["stop_signal"] is None, rec


def deadline_wait(cond, proc: subprocess.Popen, timeout: float = 30) -> None:
    def paused() -> bool:
        assert proc.poll() is None, f"wrapper exited {proc.returncode} before the pause"
        return bool(cond())

    wait_for(paused, timeout, "the wrapper to reach wrapper_marker_decided", interval=0.02)


def test_a_stale_completion_record_of_an_in_place_rerun_is_not_this_runs(tmp_path):
    # Slurm reruns the same attempt (same token) in place: the first run's complete.json must not vouch for
    # a rerun that exited 0 without completing.
    rd = tmp_path / "j"
    (rd / "result").mkdir(parents=True)
    (rd / "result" / "half.txt").write_text("x")
    protocol.write_completion(rd, 1, "t1", 5, [])
    rec = _wrapper(rd, "t1", "true")
    assert rec["returncode"] == 0 and not (rd / protocol.DONE_MARKER).exists(), rec
    assert (protocol.attempt_dir(rd, 1) / "complete.prev-1.json").exists()
