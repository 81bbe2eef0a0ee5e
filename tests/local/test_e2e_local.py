"""End to end on the real local backend: real processes, real signals, the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime

import psutil
import pytest
from localkit import DONE, GATED, PREEMPTIBLE, RETRYABLE, wrapper_record
from orchkit import wait_for, wait_for_file

from orchestrator import protocol


def _wait_gone(pid: int, timeout: float = 15) -> None:
    """Until ``pid`` has exited (a zombie nobody reaps counts as exited)."""
    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, timeout, f"pid {pid} to exit")


WRITE_RESULT = "mkdir -p result; printf 'weights-%s' \"$ORCH_JOB_NAME\" > result/model.bin; echo 1 > result/m.json"


@pytest.mark.quick  # the quick tier's one end-to-end run: submit -> verified, through the real CLI and backend
def test_outputs_job_is_verified_by_reconcile_and_orch_verify(orch):
    p = orch("submit", "--name", "e1", "--outputs", "result/*", "--", "bash", "-c", WRITE_RESULT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("submitted e1 (local ")
    assert orch.wait("e1", DONE, timeout=60) == "done_marker_verified"
    run = orch.runs / "e1"
    marker = json.loads((run / "done.json").read_text())
    assert sorted(marker["artifacts"]) == ["result/m.json", "result/model.bin"] and marker["attempt"] == 1

    v = orch("verify", "e1")
    assert (v.returncode, v.stdout) == (0, "VERIFIED\n")
    v = orch("verify", str(run))  # a run dir path works too
    assert (v.returncode, v.stdout) == (0, "VERIFIED\n")
    a = orch.show("e1")["attempts"][0]
    assert (a["state"], a["exit_code"], a["failure_class"]) == ("succeeded", 0, None)


def test_one_flipped_byte_makes_orch_verify_say_corrupt_with_exit_4(orch):
    orch("submit", "--name", "e2", "--outputs", "result/*", "--", "bash", "-c", WRITE_RESULT, check=True)
    orch.wait("e2", DONE, timeout=60)
    model = orch.runs / "e2" / "result" / "model.bin"
    data = bytearray(model.read_bytes())
    data[0] ^= 0x20
    model.write_bytes(bytes(data))
    v = orch("verify", "e2")
    assert v.returncode == 4
    assert v.stdout.startswith("CORRUPT: ") and "result/model.bin sha256 mismatch" in v.stdout
    (orch.runs / "e2" / "done.json").unlink()
    v = orch("verify", "e2")
    assert (v.returncode, v.stdout) == (4, "ABSENT: no done.json\n")


def test_job_that_writes_a_corrupt_marker_is_never_moved_to_done(orch):
    # The job writes its own done.json (as the trainer does) but lists a wrong sha256, then exits 0.
    code = ("import json, pathlib; p = pathlib.Path('result'); p.mkdir(); (p / 'out.txt').write_text('x'); "
            "pathlib.Path('done.json').write_text(json.dumps({'schema': 1, 'job': 'e3', 'attempt': 1, "
            "'finished_at': 'now', 'artifacts': {'result/out.txt': {'size': 1, 'sha256': '0' * 64}}}))")
    orch("submit", "--name", "e3", "--", sys.executable, "-c", code, check=True)
    assert orch.wait("e3", RETRYABLE | DONE, timeout=60) == "retryable_failed"
    for _ in range(2):  # later passes never promote it either
        orch("reconcile", check=True)
        assert orch.state("e3") == "retryable_failed"
    a = orch.show("e3")["attempts"][0]
    assert (a["exit_code"], a["failure_class"]) == (0, "marker_corrupt")
    assert "sha256 mismatch" in a["detail"]
    assert a["action"]["auto"] is False  # marker_corrupt waits for `orch requeue`
    v = orch("verify", "e3")
    assert v.returncode == 4 and v.stdout.startswith("CORRUPT: ")


def test_exit_0_without_a_marker_is_marker_missing(orch):
    orch("submit", "--name", "e4", "--", "true", check=True)
    assert orch.wait("e4", RETRYABLE | DONE, timeout=60) == "retryable_failed"
    assert orch.show("e4")["attempts"][0]["failure_class"] == "marker_missing"


def test_outputs_glob_matching_nothing_is_marker_missing_with_the_reason(orch):
    orch("submit", "--name", "e5", "--outputs", "result/*.pt", "--", "true", check=True)
    assert orch.wait("e5", RETRYABLE | DONE, timeout=60) == "retryable_failed"
    a = orch.show("e5")["attempts"][0]
    assert a["failure_class"] == "marker_missing" and "matched no file" in a["detail"]
    assert not (orch.runs / "e5" / "done.json").exists()


def test_submit_wait_exits_0_when_verified_and_prints_progress_on_stderr(orch):
    p = orch("submit", "--name", "w1", "--wait", "--outputs", "result/*", "--", "bash", "-c",
             "sleep 0.5; " + WRITE_RESULT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "w1: done_marker_verified (attempt 1)" in p.stderr
    assert "w1: " in p.stderr.splitlines()[0] and p.stderr.lstrip().startswith("[")
    assert p.stdout.startswith("submitted w1")
    assert "done_marker_verified" not in p.stdout  # progress goes to stderr only
    assert orch.state("w1") == "done_marker_verified"


def test_submit_wait_exits_4_when_the_job_ends_unverified(orch):
    p = orch("submit", "--name", "w2", "--wait", "--", "bash", "-c", "exit 1", timeout=60)
    assert p.returncode == 4
    assert "w2: retryable_failed (attempt 1)" in p.stderr


def test_submit_wait_json_prints_one_document(orch):
    p = orch("submit", "--name", "w3", "--wait", "--json", "--outputs", "result/*", "--", "bash", "-c",
             WRITE_RESULT, timeout=60)
    assert p.returncode == 0
    d = json.loads(p.stdout)
    assert d["name"] == "w3" and d["state"] == "done_marker_verified"


def test_job_survives_its_submitter_and_shows_running_with_its_external_id(orch):
    submitter = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "submit", "--name", "live",
                                  "--outputs", "result/*", "--", "bash", "-c", GATED],
                                 env=orch.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = submitter.communicate(timeout=60)
    assert submitter.returncode == 0, err
    run = orch.runs / "live"
    rec = wrapper_record(run)
    wrapper = psutil.Process(rec["pid"])
    assert wrapper.is_running() and wrapper.ppid() != submitter.pid
    assert os.getsid(rec["pid"]) == rec["pid"]  # its own session: a terminal hang-up does not reach it

    assert orch.wait("live", {"running"}, timeout=30) == "running"
    ext = orch.show("live")["attempts"][0]["external_id"]
    assert ext.startswith(f"{rec['pid']}@")  # session id @ start ticks since boot
    table = orch("status", check=True).stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "STATE", "ATT", "BACKEND", "JOB"]
    row = next(line.split() for line in table[1:] if line.startswith("live "))
    assert row[:5] == ["live", "running", "1", "local", ext]
    (row_json,) = orch.json("status", "--state", "running")
    assert (row_json["name"], row_json["external_id"]) == ("live", ext)

    (run / "go").touch()
    assert orch.wait("live", DONE, timeout=60) == "done_marker_verified"
    assert (run / "ran.log").read_text().count("attempt=") == 1


def test_sigkilled_job_process_is_classified_killed_and_auto_requeued_after_a_back_off(orch):
    # It was `crash`, left for a manual `orch requeue`.
    orch("submit", "--name", "k9", "--outputs", "result/*", "--", "bash", "-c", GATED, check=True)
    rec = wrapper_record(orch.runs / "k9")
    os.kill(rec["child_pid"], signal.SIGKILL)
    assert orch.wait("k9", RETRYABLE | DONE, timeout=60) == "retryable_failed"
    shown = orch.show("k9")
    a = shown["attempts"][0]
    assert a["failure_class"] == "killed" and "SIGKILL" in a["detail"]
    assert shown["auto_requeue"] is True and shown["retry_not_before"] is not None and a["counted"] is True
    assert a["exit_code"] == -signal.SIGKILL
    assert not (orch.runs / "k9" / "done.json").exists()


def test_sigterm_without_a_report_is_preempted_and_requeued_by_reconcile_itself(orch):
    # First attempt: SIGTERM to the job (as a scheduler's preemption would); no failure.json.
    # preempted is in the default auto-requeue set and does not count against --max-attempts.
    cmd = PREEMPTIBLE
    orch("submit", "--name", "pre", "--max-attempts", "1", "--outputs", "result/*", "--", "bash", "-c", cmd,
         check=True)
    run = orch.runs / "pre"
    rec = wrapper_record(run)
    os.kill(rec["child_pid"], signal.SIGTERM)
    assert orch.wait("pre", DONE, timeout=60) == "done_marker_verified"
    a1, a2 = orch.show("pre")["attempts"]
    assert (a1["failure_class"], a1["counted"], a1["action"]["auto"]) == ("preempted", False, True)
    assert a2["state"] == "succeeded"
    assert (run / "ran.log").read_text().splitlines() == ["attempt=1", "attempt=2"]


def test_a_kill_of_the_whole_session_is_killed_and_requeued_without_a_person(orch):
    """A kill -9 of the attempt's session (wrapper and program at once, as a cgroup-wide OOM kill or a
    container kill does) ended `unknown`, which waited for `orch requeue`: one job still waited 21 min later."""
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\n")
    orch("submit", "--name", "gone", "--outputs", "result/*", "--", "bash", "-c", GATED, check=True)
    rec = wrapper_record(orch.runs / "gone")
    os.killpg(rec["pid"], signal.SIGKILL)  # wrapper and job die together: no exit.json is written
    _wait_gone(rec["pid"])
    wait_for(lambda: orch("reconcile", check=True) and len(orch.show("gone")["attempts"]) == 2, 60,
             "attempt 2, launched by the reconciler alone", interval=0.3, detail=lambda: orch.show("gone"))
    a = orch.show("gone")["attempts"][0]
    assert (a["failure_class"], a["counted"], a["action"]["auto"]) == ("killed", True, True), a
    assert "without an exit record" in a["detail"], a
    assert not (protocol.attempt_dir(orch.runs / "gone", 1) / "exit.json").exists()
    wait_for_file(protocol.attempt_dir(orch.runs / "gone", 2) / "wrapper.json")
    (orch.runs / "gone" / "go").touch()
    assert orch.wait("gone", DONE, timeout=60) == "done_marker_verified"


def test_cancel_terminates_a_running_job_and_marks_it_cancelled(orch):
    orch("submit", "--name", "c1", "--", "bash", "-c", GATED, check=True)
    rec = wrapper_record(orch.runs / "c1")
    p = orch("cancel", "c1")
    assert (p.returncode, p.stdout) == (0, "c1: cancelled\n")
    assert orch.state("c1") == "cancelled"
    _wait_gone(rec["pid"])
    _wait_gone(rec["child_pid"])  # the SIGTERM reached the job itself
    orch("reconcile", check=True)
    assert orch.state("c1") == "cancelled"


def test_bundled_trainer_tiny_preset_ends_verified(orch):
    p = orch("submit", "--name", "tiny", "--wait", "--", sys.executable, "-m", "orch_trainer", "--preset", "tiny",
             "--max-steps", "20", timeout=150)
    assert p.returncode == 0, p.stderr
    run = orch.runs / "tiny"
    assert protocol.verify_done_marker(run).verified
    marker = json.loads((run / "done.json").read_text())
    assert {"result/model.pt", "result/metrics.json"} <= set(marker["artifacts"])
    cfg = json.loads((run / "run_config.json").read_text())
    assert cfg["resumed_from_step"] is None and "data_sha256" in cfg
    # Started again on a verified run dir, the trainer writes nothing and says so.
    before = {str(q.relative_to(run)): q.stat().st_mtime_ns for q in run.rglob("*")}
    again = subprocess.run([sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--run-dir", str(run)],
                           capture_output=True, text=True, timeout=120, env=orch.env)
    assert again.returncode == 0 and "already complete" in (again.stdout + again.stderr)
    assert {str(q.relative_to(run)): q.stat().st_mtime_ns for q in run.rglob("*")} == before


LEFTOVER_WITH_A_KIT = r'''
import pathlib, time
from orchestrator import protocol
from orchestrator.kit.preemption import PreemptionFlag
flag = PreemptionFlag().install()
pathlib.Path("child.ready").touch()
while not flag.requested:
    time.sleep(0.02)
while not (pathlib.Path("attempts/1") / protocol.STOP_FILE).exists():
    time.sleep(0.02)
'''
MAIN_WITH_A_LEFTOVER = (f"import pathlib, subprocess, sys, time\n"
                        f"subprocess.Popen([sys.executable, '-c', {LEFTOVER_WITH_A_KIT!r}])\n"
                        "while not pathlib.Path('child.ready').exists():\n    time.sleep(0.02)\n"
                        "pathlib.Path('main.ready').touch()\ntime.sleep(600)\n")


def test_a_kill_9_of_the_program_is_killed_though_a_leftover_recorded_a_stop_after_it(orch):
    """The program kill -9'd; the wrapper then stopped the process it left (SIGTERM), whose kit wrote
    stop.json: the attempt was `preempted` (free, uncounted) from a record made after the program's end."""
    orch("submit", "--name", "left", "--outputs", "result/*", "--", sys.executable, "-c", MAIN_WITH_A_LEFTOVER,
         check=True)
    run = orch.runs / "left"
    wait_for_file(run / "main.ready")
    os.kill(wrapper_record(run)["child_pid"], signal.SIGKILL)
    assert orch.wait("left", RETRYABLE | DONE, timeout=60) == "retryable_failed"
    a = orch.show("left")["attempts"][0]
    assert (a["failure_class"], a["exit_code"]) == ("killed", -signal.SIGKILL), a
    adir = protocol.attempt_dir(run, 1)
    stop, rec = protocol.read_stop(adir), protocol.read_exit(adir)
    assert stop is not None and rec is not None and rec.program_ended_at, (stop, rec)
    assert datetime.fromisoformat(stop.at) > datetime.fromisoformat(rec.program_ended_at), (stop, rec)
