"""`orch watch` and `orch submit --wait`: a live bar on a real terminal (a pty), plain lines on a pipe.

The jobs are real local jobs writing real heartbeats (``protocol.write_progress``, what the trainer's
heartbeat thread and the integrations call); nothing but `orch watch` itself runs reconcile passes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from orchkit import wait_for, wait_for_file
from ptykit import PtyProcess

from orchestrator import protocol

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestrator.cli"]

# Heartbeats for steps 1..7 of 20, then it waits for <run_dir>/go (a minute at most), then steps 8..20
# and a result. The bar must show 7/20 while it waits: a fact about the job, not about timing.
PROGRESS_JOB = r'''
import os, sys, time
from orchestrator import protocol
rd, n = os.environ["ORCH_RUN_DIR"], int(os.environ["ORCH_ATTEMPT"])
N, GATE = 20, 7
for s in range(1, N + 1):
    if s == GATE + 1:
        t0 = time.time()
        while not os.path.exists("go") and time.time() - t0 < 60:
            time.sleep(0.05)
        if not os.path.exists("go"):
            sys.exit(1)
    protocol.write_progress(rd, n, step=s, max_steps=N, loss=4.0 / s, tokens_per_s=2048.0, tokens_per_step=512)
    time.sleep(0.02)
os.makedirs("result", exist_ok=True)
open("result/out.txt", "w").write("ok")
'''


def submit_gated(orch, name: str) -> None:
    orch("submit", "--name", name, "--outputs", "result/*", "--", sys.executable, "-c", PROGRESS_JOB, check=True)


def at_step(orch, name: str, step: int) -> None:
    """Wait (on the job's own heartbeat file) until it has posted ``step``."""
    p = protocol.attempt_dir(orch.runs / name, 1) / protocol.PROGRESS_FILE
    wait_for_file(p)
    wait_for(lambda: json.loads(p.read_text() or "{}").get("step") == step, 60, f"{name} to reach step {step}")


def test_watch_on_a_terminal_draws_a_live_bar_and_exits_0_when_verified(orch):
    submit_gated(orch, "wbar")
    term = PtyProcess([*CLI, "watch", "wbar"], orch.env, ROOT)
    try:
        bar = term.expect(r"wbar running.*7/20 · loss 0\.5714 · 2\.0k tok/s · ETA \d+:\d\d:\d\d · attempt 1 · "
                          r"restarts 0")
        assert "━" in term.text[bar.start():]  # rich's bar glyphs, not a plain line
        (orch.runs / "wbar" / "go").touch()
        term.expect(r"wbar done_marker_verified.*20/20 · loss 0\.2 · 2\.0k tok/s · attempt 1")
        assert term.wait() == 0
    finally:
        term.kill()
    shown = term.text
    assert "[" in shown and "wbar: running (attempt 1" in shown  # the state changes, printed above the bar
    assert "wbar: done_marker_verified (attempt 1, step 20)" in shown
    assert "\x1b[" in term.raw.decode()  # it really redrew in place
    assert "Traceback" not in shown


def test_submit_wait_on_a_terminal_draws_the_bar(orch):
    term = PtyProcess([*CLI, "submit", "--name", "sbar", "--wait", "--outputs", "result/*", "--", sys.executable,
                       "-c", PROGRESS_JOB], orch.env, ROOT)
    try:
        term.expect(r"submitted sbar \(local ")
        term.expect(r"sbar running.*7/20 · loss 0\.5714")
        (orch.runs / "sbar" / "go").touch()
        term.expect(r"sbar done_marker_verified.*20/20")
        assert term.wait() == 0
    finally:
        term.kill()
    assert orch.state("sbar") == "done_marker_verified"


def ctrl_c_at_step_7(argv: list[str], orch, name: str) -> str:
    """Run ``argv`` on a terminal, press Ctrl-C once the bar shows step 7, expect exit 130; the screen."""
    term = PtyProcess(argv, orch.env, ROOT)
    try:
        term.expect(rf"{name} running.*7/20")
        term.send(b"\x03")  # the terminal's interrupt key: SIGINT from the line discipline
        assert term.wait(timeout=30) == 130
    finally:
        term.kill()
    assert "Traceback" not in term.text
    assert orch.state(name) == "running"  # the job goes on
    (orch.runs / name / "go").touch()
    return term.text


def test_ctrl_c_stops_watching_quietly_with_130_and_the_job_goes_on(orch):
    submit_gated(orch, "wint")
    shown = ctrl_c_at_step_7([*CLI, "watch", "wint"], orch, "wint")
    assert "orch:" not in shown
    assert orch.wait("wint", {"done_marker_verified"}, timeout=60) == "done_marker_verified"


def test_ctrl_c_during_submit_wait_says_the_job_goes_on(orch):
    argv = [*CLI, "submit", "--name", "sint", "--wait", "--outputs", "result/*", "--", sys.executable, "-c",
            PROGRESS_JOB]
    shown = ctrl_c_at_step_7(argv, orch, "sint")
    assert "orch: interrupted (the job goes on; `orch watch` follows it again)" in shown
    assert orch("watch", "sint", timeout=60).returncode == 0


def test_watch_on_a_pipe_prints_plain_lines_a_script_can_parse(orch):
    submit_gated(orch, "wplain")
    at_step(orch, "wplain", 7)
    (orch.runs / "wplain" / "go").touch()
    p = orch("watch", "wplain", timeout=90)
    assert p.returncode == 0, p.stderr
    assert "\x1b" not in p.stdout and "━" not in p.stdout
    lines = p.stdout.splitlines()
    line_re = re.compile(r"^\[\s*\d+\.\ds\] wplain: (\w+) \(attempt 1(?:, step (\d+))?\)(.*)$")
    assert lines and all(line_re.match(x) for x in lines), lines
    last = line_re.match(lines[-1])
    assert (last.group(1), last.group(2)) == ("done_marker_verified", "20")
    assert last.group(3).split("  ")[1:] == ["max 20", "loss 0.2", "2.0k tok/s"]
    # One line per state change: the running state is not repeated for every poll.
    assert len(lines) <= 4, lines


def test_submit_wait_piped_keeps_its_plain_lines_on_stderr(orch):
    p = orch("submit", "--name", "spipe", "--wait", "--outputs", "result/*", "--", "bash", "-c",
             "mkdir -p result; echo ok > result/out.txt", timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("submitted spipe") and "\x1b" not in p.stderr
    assert "spipe: done_marker_verified (attempt 1)" in p.stderr


def test_watch_exits_4_when_the_job_ends_unverified_and_json_prints_one_document(orch):
    orch("submit", "--name", "wfail", "--", "bash", "-c", "exit 1", check=True)
    p = orch("watch", "wfail", "--json", timeout=60)
    assert p.returncode == 4, p.stderr
    d = json.loads(p.stdout)
    assert (d["name"], d["state"], d["attempts"][0]["failure_class"]) == ("wfail", "retryable_failed", "crash")


def test_watch_of_an_unknown_job_exits_2_with_one_line(orch):
    p = orch("watch", "nope")
    assert (p.returncode, p.stdout, p.stderr) == (2, "", "orch: no job named 'nope'\n")


def test_watch_without_reconcile_only_reads_and_follows_another_reconciler(orch):
    submit_gated(orch, "wread")
    watcher = subprocess.Popen([*CLI, "watch", "wread", "--no-reconcile", "--interval", "0.2"], env=orch.env,
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        (orch.runs / "wread" / "go").touch()
        wait_for_file(orch.runs / "wread" / protocol.DONE_MARKER, timeout=60)
        wait_for_file(protocol.attempt_dir(orch.runs / "wread", 1) / protocol.EXIT_FILE, timeout=60)
        assert watcher.poll() is None  # the job is over, but nobody has reconciled: still watching
        assert orch.state("wread") == "submitted"
        orch("reconcile", check=True)  # what cron would do
        out, err = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    assert out.splitlines()[-1].split("] ", 1)[1].startswith("wread: done_marker_verified (attempt 1, step 20)")


IMPORTS_OF = ("import sys\nfrom orchestrator.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
              "    print(sorted(m for m in ('torch', 'rich', 'matplotlib', 'numpy') if m in sys.modules), e.code)\n")


def test_watch_on_a_pipe_and_plot_json_import_no_torch_no_rich_no_matplotlib(orch):
    p = orch("submit", "--name", "light", "--wait", "--", "bash", "-c", "exit 0", timeout=60)
    assert p.returncode == 4
    for args in (["watch", "light"], ["plot", "light", "--json"]):
        r = subprocess.run([sys.executable, "-c", IMPORTS_OF, *args], capture_output=True, text=True, env=orch.env,
                           cwd=ROOT, timeout=60)
        assert r.stdout.splitlines()[-1] in ("[] 4", "[] 0"), (args, r.stdout, r.stderr)


SWEEP_TASK = "mkdir -p result; echo {i} > result/out.txt; exit $(( {i} > 2 ))"  # task i=3 fails (crash)
SWEEP_LINE = re.compile(r"^\[\s*\d+\.\ds\] (\w+): sweep of (\d+): (.+)$")


def test_watch_of_a_sweep_follows_every_task_and_exits_0_when_all_verify(orch):
    """`orch watch SWEEP` was refused (exit 2) though show, cancel and status take sweep names."""
    orch("sweep", "--name", "sw", "--grid", "i=0,1,2", "--outputs", "result/*", "--", "bash", "-c", SWEEP_TASK,
         check=True)
    p = orch("watch", "sw", timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines and all(SWEEP_LINE.match(x) for x in lines), lines
    assert SWEEP_LINE.match(lines[-1]).groups() == ("sw", "3", "3 done_marker_verified")
    assert len(set(lines)) == len(lines), lines  # a line per change of the counts, not per look
    assert [t["state"] for t in orch.json("show", "sw", "--json")["task_list"]] == ["done_marker_verified"] * 3


def test_watch_of_a_sweep_with_a_failed_task_exits_4_and_json_prints_the_sweep(orch):
    orch("sweep", "--name", "swf", "--grid", "i=2,3", "--outputs", "result/*", "--", "bash", "-c", SWEEP_TASK,
         check=True)
    p = orch("watch", "swf", "--json", timeout=90)
    assert p.returncode == 4, p.stdout + p.stderr
    d = json.loads(p.stdout)
    assert (d["name"], d["kind"], d["tasks"]) == ("swf", "sweep", 2)
    assert sorted(t["state"] for t in d["task_list"]) == ["done_marker_verified", "retryable_failed"]


def test_watch_of_a_sweep_on_a_terminal_draws_a_bar_of_the_tasks_verified(orch):
    orch("sweep", "--name", "swbar", "--grid", "i=0,1", "--outputs", "result/*", "--", "bash", "-c", SWEEP_TASK,
         check=True)
    term = PtyProcess([*CLI, "watch", "swbar"], orch.env, ROOT)
    try:
        term.expect(r"swbar sweep.*2/2 verified")
        assert term.wait() == 0
    finally:
        term.kill()
    assert "swbar: sweep of 2: 2 done_marker_verified" in term.text and "━" in term.text
    assert "Traceback" not in term.text
