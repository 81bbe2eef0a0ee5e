"""Spot notices end to end: a real local job, orch's real wrapper polling a fake metadata server on
127.0.0.1 (tests/fakemeta.py). A notice stops the program within about one poll interval, as a
preemption's SIGTERM would; the attempt is classified preempted, requeued by reconcile, and ends
verified. Garbage never stops a job, and with the watcher off nothing is polled at all.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from fakemeta import FakeMetadata
from localkit import DONE, RETRYABLE, wrapper_record
from orchkit import wait_for, wait_for_file

from orchestrator import protocol

INTERVAL_S = 0.5
SLACK_S = 2.5  # two busy cores shared with other test runs
ENDED = DONE | RETRYABLE | {"failed"}
VERIFIED = "done_marker_verified"
# A program with its own checkpoint: on SIGTERM it saves its step and exits 0 (as Lightning does); a later
# attempt resumes from that step and writes its result. Left alone, attempt 1 gives up after a minute.
PROGRAM = r"""
import os, pathlib, signal, sys, time
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(time.time()))
ckpt = pathlib.Path("ckpt.txt")
start = int(ckpt.read_text()) if ckpt.exists() else 0
pathlib.Path("attempts.log").open("a").write(f"{os.environ['ORCH_ATTEMPT']} from {start}\n")
step, steps = start, (1200 if start == 0 else 40)
while step < start + steps and not stopped:
    time.sleep(0.05)
    step += 1
if stopped:
    ckpt.write_text(str(step))
    pathlib.Path(f"sigterm-{os.environ['ORCH_ATTEMPT']}").write_text(repr(stopped[0]))
    sys.exit(0)
if start == 0:
    sys.exit(1)
pathlib.Path("result").mkdir(exist_ok=True)
pathlib.Path("result/out.txt").write_text(f"resumed from {start}, ended at {step}")
"""


def spot_config(orch, md: FakeMetadata, notice: str | None = None) -> None:
    orch.write_config(f'[spot]\nurl = "{md.url}"\ninterval_s = {INTERVAL_S}\n'
                      + (f'notice = "{notice}"\n' if notice else ""))


def submit(orch, name: str, *flags: str) -> None:
    orch("submit", "--name", name, "--outputs", "result/*", *flags, "--", sys.executable, "-c", PROGRAM, check=True)


def exit_record(run_dir, n: int = 1) -> dict:
    p = protocol.attempt_dir(run_dir, n) / protocol.EXIT_FILE
    wait_for_file(p, 60)
    return json.loads(p.read_text())


@pytest.mark.parametrize("provider,how", [("aws", "flag"), ("gcp", "flag"), ("azure", "flag"),
                                          ("azure", "auto in orch.toml")])
def test_a_spot_notice_stops_the_job_within_an_interval_and_it_is_requeued_and_verified(orch, provider, how):
    with FakeMetadata(provider) as md:
        spot_config(orch, md, "auto" if how.startswith("auto") else None)
        submit(orch, "spot", *(["--spot-notice", provider] if how == "flag" else []))
        run = orch.runs / "spot"
        rec = wrapper_record(run)
        wait_for(lambda: len(md.polls("quiet")) >= 2, what="two polls answered 'no notice'")
        assert os.path.exists(f"/proc/{rec['child_pid']}")  # "no notice" stopped nothing

        notice_at = md.set("notice")
        ex = exit_record(run)
        # the first poll after the switch saw the notice, and the program had its SIGTERM at once
        assert md.first_notice_at is not None and md.first_notice_at - notice_at < INTERVAL_S + SLACK_S
        assert float((run / "sigterm-1").read_text()) - notice_at < INTERVAL_S + SLACK_S
        assert (ex["returncode"], ex["stop_signal"], ex["stop_source"]) == (0, "TERM", "spot_notice")
        assert ex["notice"].startswith(f"{provider}: "), ex
        assert ex["marker_error"] == "not written: the program was sent SIGTERM (spot_notice)"
        assert not (run / protocol.DONE_MARKER).exists()  # exit 0 after a stop is never a finished run
        md.set("quiet")  # the next attempt runs on a VM without a notice
        assert orch.wait("spot", ENDED, timeout=90) == VERIFIED, orch.show("spot")

    a1, a2 = orch.show("spot")["attempts"]
    assert (a1["failure_class"], a1["counted"], a1["action"]["auto"]) == ("preempted", False, True), a1
    assert "spot_notice" in a1["detail"] and f"{provider}: " in a1["detail"], a1
    assert a2["state"] == "succeeded"
    step = int((run / "ckpt.txt").read_text())
    assert (run / "attempts.log").read_text() == f"1 from 0\n2 from {step}\n"
    assert (run / "result" / "out.txt").read_text() == f"resumed from {step}, ended at {step + 40}"
    assert not (run / "sigterm-2").exists()
    log = (protocol.attempt_dir(run, 1) / protocol.WRAPPER_LOG).read_text()
    assert f"watching {provider} at {md.url}" in log and "stopping the program as for a preemption" in log


def test_garbage_answers_never_stop_the_job_or_the_wrapper_and_a_later_notice_still_does(orch):
    with FakeMetadata("aws") as md:
        spot_config(orch, md)
        submit(orch, "junk", "--spot-notice", "aws")
        run = orch.runs / "junk"
        rec = wrapper_record(run)
        for mode in ("html", "500", "huge", "hang", "quiet"):
            md.set(mode)
            n = len(md.polls(mode))
            wait_for(lambda n=n, mode=mode: len(md.polls(mode)) >= n + 2, what=f"two polls while {mode}")
            assert os.path.exists(f"/proc/{rec['child_pid']}") and os.path.exists(f"/proc/{rec['pid']}"), mode
            assert not (protocol.attempt_dir(run, 1) / protocol.EXIT_FILE).exists()
        md.set("notice")
        ex = exit_record(run)
    assert (ex["stop_source"], ex["returncode"]) == ("spot_notice", 0)
    log = (protocol.attempt_dir(run, 1) / protocol.WRAPPER_LOG).read_text()
    assert log.count("polling continues") == 1, log
    assert "Traceback" not in log
    orch("reconcile", check=True)  # preempted, requeued; the fake is gone: attempt 2 is refused, finishes
    assert orch.wait("junk", ENDED, timeout=90) == VERIFIED, orch.show("junk")


def test_with_the_watcher_off_nothing_is_polled(orch):
    with FakeMetadata("aws") as md:
        spot_config(orch, md, "aws")
        run = orch.runs / "off"
        (run / "ckpt.txt").parent.mkdir(parents=True)
        (run / "ckpt.txt").write_text("1")  # resume from step 1: 40 steps (2 s, four intervals), then the result
        submit(orch, "off", "--spot-notice", "off")
        assert orch.wait("off", ENDED, timeout=60) == VERIFIED
        assert md.requests == []
        log = protocol.attempt_dir(run, 1) / protocol.WRAPPER_LOG
        assert "spot" not in (log.read_text() if log.exists() else "")

        # The same job with orch.toml's default (notice = "aws") polls: the fake would have seen it.
        on = orch.runs / "on"
        (on / "ckpt.txt").parent.mkdir(parents=True)
        (on / "ckpt.txt").write_text("1")
        submit(orch, "on")
        assert orch.wait("on", ENDED, timeout=60) == VERIFIED
        assert len(md.polls("quiet")) >= 2


def test_the_bundled_trainer_checkpoints_on_a_notice_and_resumes_from_that_step(orch):
    with FakeMetadata("gcp") as md:
        spot_config(orch, md)
        orch("submit", "--name", "tr", "--spot-notice", "gcp", "--", sys.executable, "-m", "orch_trainer", "--preset",
             "tiny", "--max-steps", "300", "--save-interval", "100000", "--heartbeat-interval", "0.2", check=True)
        run = orch.runs / "tr"
        progress = protocol.attempt_dir(run, 1) / protocol.PROGRESS_FILE
        wait_for(lambda: progress.exists() and json.loads(progress.read_text()).get("step", 0) >= 3, 120,
                   "the trainer at step 3")
        md.set("notice")
        ex = exit_record(run)
        md.set("quiet")
        assert (ex["stop_signal"], ex["stop_source"], ex["notice"]) == ("TERM", "spot_notice", "gcp: preempted")
        assert orch.wait("tr", ENDED, timeout=180) == VERIFIED, orch.show("tr")
    a1, a2 = orch.show("tr")["attempts"]
    assert (a1["failure_class"], a1["counted"]) == ("preempted", False), a1
    assert 3 <= a1["failure_step"] < 300, a1  # the trainer's own report: the last completed step, saved
    cfg = json.loads((run / protocol.RUN_CONFIG).read_text())
    assert cfg["resumed_from_step"] == a1["failure_step"]  # no periodic checkpoint: only the notice's one
