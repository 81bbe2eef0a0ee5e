"""Process identity that survives clocks and partial kills: a live job is never declared
dead (and run a second time) because its wrapper died, the boot time moved, it wrote its own
exit.json, or it forged wrapper.json; and orch's signals only ever reach the job's own processes.

Every test samples the job's processes in the background (advkit.ProcessSampler) and asserts the
invariant at every sample: at most one live process tree per job.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from advkit import (
    PY,
    ROOT,
    ProcessSampler,
    assert_no_stuck,
    job_argv,
    live_job_procs,
    need_root,
    pid_alive,
    reconcile_ok,
    settle,
    show,
    unavailable,
    wait_no_procs,
    wrapper_pids,
)
from orchkit import wait_for

from orchestrator import protocol
from orchestrator.backends.local import LocalId, format_id, liveness, parse_id
from orchestrator.jobside import proctable

LIVE = {"submitted", "running"}


def _submit(orch, name: str, *job_args: str, outputs: bool = True, env: dict | None = None,
            expect_rc: tuple[int, ...] = (0,)) -> Path:
    extra = ["--outputs", "result/out.txt"] if outputs else []
    p = orch("submit", "--name", name, *extra, "--", *job_argv(*job_args), env=env, timeout=60)
    assert p.returncode in expect_rc, (p.returncode, p.stdout, p.stderr)
    return orch.runs / name


def _one_live_attempt(orch, name: str) -> dict:
    d = show(orch, name)
    assert len(d["attempts"]) == 1, f"{name} was requeued while its first attempt runs: {d['attempts']}"
    assert d["state"] in LIVE, f"{name} is {d['state']} while its process still runs: {d['attempts'][-1]}"
    return d


def _finish_and_check(orch, name: str, run: Path, sampler: ProcessSampler) -> None:
    """Let the gated job end; it must end done with its first (only) attempt, as an uninterrupted run."""
    (run / "go").touch()
    wait_no_procs(run, 40, "after go")
    settle(orch, [name])
    sampler.stop()
    sampler.assert_never_two_attempts()
    d = show(orch, name)
    assert d["state"] == "done_marker_verified", d
    assert len(d["attempts"]) == 1, d["attempts"]
    assert protocol.verify_done_marker(run).verified
    assert (run / "result" / "out.txt").read_text() == f"ok {name}\n"  # what an uninterrupted run writes
    assert (run / "ran.log").read_text().count("attempt=") == 1, (run / "ran.log").read_text()
    assert_no_stuck(orch)


def test_killing_only_the_wrapper_never_starts_a_second_attempt(orch):
    """A live job was declared dead after only the job wrapper was kill -9ed (the trainer survived, requeue
    even moved its in-progress checkpoint to trash)."""
    # A user may let reconcile retry `unknown` by itself (any class may be listed): even then the
    # surviving job must not be run a second time.
    orch.write_config('[policy]\nauto_requeue = ["preempted", "timeout", "node_fail", "oom", "hang", "nan", '
                      '"enospc", "crash", "unknown"]\n')
    run = orch.runs / "w"
    sampler = ProcessSampler(run)
    try:
        _submit(orch, "w", "--ckpt", "--marker", outputs=False)
        part = run / "checkpoints" / "step-00000007.tmp-inprogress" / "model.part"
        wait_for(part.exists, 30, "the job's in-progress checkpoint")
        wrappers = wait_for(lambda: wrapper_pids(run), 30, "the wrapper process (by /proc scan)")
        assert len(wrappers) == 1, wrappers
        (wpid,) = wrappers
        os.kill(wpid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(wpid), 10, "the wrapper to die")
        assert live_job_procs(run), "killing the wrapper alone must leave the job itself running"

        for _ in range(5):
            reconcile_ok(orch)
            sampler.assert_never_two_attempts()
            _one_live_attempt(orch, "w")
            assert live_job_procs(run)
            time.sleep(0.3)  # pacing between passes, not synchronisation
        # A user who thinks the job is dead tries to rerun it: refused, it is live.
        r = orch("requeue", "w")
        assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
        assert re.search(r"live|running", r.stdout + r.stderr, re.I), r.stdout + r.stderr
        _one_live_attempt(orch, "w")

        size = part.stat().st_size
        wait_for(lambda: part.exists() and part.stat().st_size > size, 10, "the job to keep writing its checkpoint")
        trashed = [p for t in (orch.home / "trash", orch.runs / ".orch-trash") if t.exists() for p in t.rglob("*")]
        assert not trashed, f"a live job's files were moved to trash: {trashed}"
        _finish_and_check(orch, "w", run, sampler)
    finally:
        sampler.stop()


def _shifted_stat(tmp_path: Path, shift: int) -> tuple[Path, int]:
    text = Path("/proc/stat").read_text()
    m = re.search(r"(?m)^btime (\d+)$", text)
    assert m, "no btime line in /proc/stat"
    new = int(m.group(1)) + shift
    f = tmp_path / f"stat{shift:+d}"
    f.write_text(text[:m.start()] + f"btime {new}" + text[m.end():])
    return f, new


def _reconcile_with_btime(orch, tmp_path: Path, shift: int) -> subprocess.CompletedProcess:
    """One `orch reconcile` in a private mount namespace whose /proc/stat says the host booted
    ``shift`` seconds later (a VM restore or a clock step moved it once, unprompted)."""
    f, new = _shifted_stat(tmp_path, shift)
    script = ('mount --bind "$1" /proc/stat || exit 97; grep "^btime" /proc/stat >&2; '
              'exec "$2" -m orchestrator.cli reconcile')
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(f), PY],
                       env=orch.env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    if p.returncode == 97 or "unshare:" in p.stderr:
        unavailable(f"cannot bind-mount /proc/stat in a private mount namespace: {p.stderr.strip()}")
    assert f"btime {new}" in p.stderr, f"the shifted btime was not in effect: {p.stderr}"
    return p


def test_a_boot_time_shift_of_one_second_never_declares_a_live_job_dead(orch, tmp_path):
    """A live job was declared dead after the host's boot-time value shifted by one second (psutil's
    create_time moved and the 20 ms slack no longer matched); seen through a private mount namespace."""
    need_root()
    run = orch.runs / "bt"
    sampler = ProcessSampler(run)
    try:
        _submit(orch, "bt", "--result")
        wait_for((run / "started").exists, 30, "the job to start")
        reconcile_ok(orch)  # an ordinary pass first: the job is seen running
        for shift in (1, -1, 1, -1):
            p = _reconcile_with_btime(orch, tmp_path, shift)
            assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
            _one_live_attempt(orch, "bt")
            assert live_job_procs(run), "the job died"
        _finish_and_check(orch, "bt", run, sampler)
    finally:
        sampler.stop()


NAMESPACES = {  # how a reconciler comes to see other pids or shifted start ticks
    "time": ["--time", "--boottime", "100000", "--fork"],
    "pid": ["--pid", "--fork", "--mount-proc"],
}


def _reconcile_in(orch, how: str) -> subprocess.CompletedProcess:
    """One `orch reconcile` run in a fresh namespace of kind ``how`` (a container, a VM restore)."""
    p = subprocess.run(["unshare", *NAMESPACES[how], PY, "-m", "orchestrator.cli", "reconcile"],
                       env=orch.env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    if "unshare:" in p.stderr:
        unavailable(f"cannot create a {how} namespace: {p.stderr.strip()}")
    return p


@pytest.mark.parametrize("how,ident", [("time", "new"), ("pid", "new"), ("time", "old")])
def test_a_reconciler_in_another_namespace_never_declares_a_live_job_dead(orch, how, ident):
    """A hostile tester: a pass under `unshare --time --boottime 100000` (start ticks shifted) or
    `unshare --pid --mount-proc` (no job in sight) declared a running job retryable_failed, and
    `orch requeue` then ran attempt 2 beside attempt 1. old: an id written before namespaces were
    recorded (``sid@ticks``), where only the start-ticks mismatch while the session lives is seen."""
    need_root()
    name = f"ns-{how}-{ident}"
    run = orch.runs / name
    sampler = ProcessSampler(run)
    try:
        _submit(orch, name, "--result")
        wait_for((run / "started").exists, 30, "the job to start")
        reconcile_ok(orch)
        ext = show(orch, name)["attempts"][0]["external_id"]
        assert parse_id(ext).ns == proctable.namespaces(), ext  # the launch recorded its namespaces
        if ident == "old":
            with sqlite3.connect(orch.home / "orch.db") as con:
                con.execute("UPDATE attempts SET external_id = ? WHERE external_id = ?", (ext.rsplit("@", 1)[0], ext))
            assert parse_id(show(orch, name)["attempts"][0]["external_id"]).ns is None
        for _ in range(3):
            p = _reconcile_in(orch, how)
            assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
            assert f"{name}: unknown (liveness undecidable" in p.stdout, p.stdout + p.stderr
            _one_live_attempt(orch, name)
            assert live_job_procs(run), "the job died"
            sampler.assert_never_two_attempts()
        r = orch("requeue", name)
        assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
        assert f"{name}: refused (job is running;" in r.stdout, r.stdout + r.stderr
        _one_live_attempt(orch, name)
        _finish_and_check(orch, name, run, sampler)
    finally:
        sampler.stop()


def test_local_ids_old_and_new_formats_parse_and_name_their_namespaces():
    """Every id a local attempt ever recorded still parses; the namespace part is optional."""
    assert parse_id("4242@123456") == LocalId(4242, 123456, None)  # before namespaces were recorded
    assert parse_id("4242@?") == LocalId(4242, None, None)
    assert parse_id("4242:1700000000123") == LocalId(4242, None, None)  # 0.1's pid:create_ms
    assert parse_id("4242@123456@4026531836.4026531834") == LocalId(4242, 123456, (4026531836, 4026531834))
    assert parse_id("4242@?@7.0") == LocalId(4242, None, (7, 0))
    for bad in (None, "", "1@5", "0@5", "x@5", "4242", "4242@5@7", "4242@5@7.x", "4242@5@.7", "4242@5 ", "-3@5"):
        assert parse_id(bad) is None, bad
    for sid, ticks, ns in ((4242, 123456, None), (4242, None, None), (4242, 9, (1, 2)), (4242, None, (3, 0))):
        assert parse_id(format_id(sid, ticks, ns)) == LocalId(sid, ticks, ns)


def test_liveness_answers_unknown_for_what_it_cannot_tell_and_gone_only_for_an_empty_session(spawned):
    """A real session (a sleep in its own session): alive under its true id; unknown under another
    namespace, under unreadable /proc, or with start ticks that do not match while it lives; gone
    once it has ended."""
    here = proctable.namespaces()
    assert here is not None, "this process's /proc is its own PID namespace's"
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    spawned.append(sleeper)
    ticks = wait_for(lambda: proctable.read_proc(sleeper.pid), 10, "the sleeper in /proc").start_ticks

    def state(ext: str, ns: tuple[int, int] | None = here) -> str:
        return liveness(ext, "tok", proctable.sessions(), ns).state

    assert state(format_id(sleeper.pid, ticks, here)) == "alive"
    assert state(format_id(sleeper.pid, ticks)) == "alive"  # an old id: judged by pid + ticks
    assert state(format_id(sleeper.pid, ticks, (here[0] + 1, here[1]))) == "unknown"  # launched in another PID ns
    assert state(format_id(sleeper.pid, ticks, (here[0], here[1] + 1))) == "unknown"  # ... another time ns
    assert state(format_id(sleeper.pid, ticks, here), ns=None) == "unknown"  # this /proc is not ours
    assert state(format_id(sleeper.pid, ticks + 1, here)) == "unknown"  # shifted ticks, session lives
    assert state(format_id(sleeper.pid, ticks + 1)) == "unknown"
    assert state(format_id(sleeper.pid, None)) == "unknown"  # members without the token: never "gone"
    sleeper.kill()
    sleeper.wait()
    assert state(format_id(sleeper.pid, ticks, here)) == "gone"
    assert state(format_id(sleeper.pid, ticks + 1, here)) == "gone"


def test_a_running_job_that_writes_its_own_exit_json_is_not_declared_ended(orch):
    """A live job was declared ended after it wrote its own exit.json (real token, returncode 0)."""
    run = orch.runs / "fx"
    sampler = ProcessSampler(run)
    try:
        _submit(orch, "fx", "--fake-exit", "--result")
        wait_for((run / "started").exists, 30, "the job to write its exit.json")
        assert (protocol.attempt_dir(run, 1) / "exit.json").exists()
        for _ in range(5):
            reconcile_ok(orch)
            _one_live_attempt(orch, "fx")
            assert live_job_procs(run), "the job died"
        _finish_and_check(orch, "fx", run, sampler)
    finally:
        sampler.stop()


@pytest.mark.parametrize("how", ["launched", "found_by_token"])
def test_a_forged_wrapper_json_never_aims_cancel_at_a_foreign_process(orch, spawned, how):
    """A wrapper.json with a foreign pid made orch cancel kill an unrelated process.

    found_by_token: the submitting orch dies right after the backend call (ORCH_FAULT), so the
    reconciler must find the attempt again; it must not take the pid from the job-written file.
    """
    victim = subprocess.Popen(["sleep", "120"], start_new_session=True)  # unrelated; the test owns it
    spawned.append(victim)
    run = orch.runs / "forged"
    sampler = ProcessSampler(run)
    try:
        env = {"ORCH_FAULT": "after_backend_submit"} if how == "found_by_token" else None
        _submit(orch, "forged", "--forge-wrapper", str(victim.pid), env=env, expect_rc=(0, 99) if env else (0,))
        wait_for((run / "started").exists, 30, "the job to forge its wrapper.json")
        if how == "found_by_token":
            reconcile_ok(orch, env={"ORCH_LAUNCH_GRACE_S": "0"})
        reconcile_ok(orch)
        r = orch("cancel", "forged")
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        # The unrelated process must survive: poll it for 3 s.
        for _ in range(60):
            assert victim.poll() is None, f"orch cancel killed an unrelated process (pid {victim.pid})"
            time.sleep(0.05)
        wait_no_procs(run, 40, "after orch cancel")  # ...and the job's own processes did end
        settle(orch, ["forged"])
        sampler.stop()
        sampler.assert_never_two_attempts()
        d = show(orch, "forged")
        assert d["state"] == "cancelled", d
        assert len(d["attempts"]) == 1, d["attempts"]
        assert_no_stuck(orch)
    finally:
        sampler.stop()
        victim.kill()


def test_a_stale_launchs_cancel_never_reaches_the_relaunch_that_carries_the_same_token(tmp_path):
    """Hostile test: a launcher stalled past the grace submitted anyway; its wrapper, under a stale
    fence, exited at once; its record then cancelled its own submission, whose session was gone, and the token
    fallback (for torchrun's ranks, in sessions of their own) found the re-claimer's healthy relaunch, which
    carries the same attempt token, and SIGTERMed it. A process under another live job wrapper is that launch's.
    Real processes: a relaunch (a process named as a job wrapper, its program beside it, the token in both), a
    dead session for the stale launch, and an orphan of the stale launch (a rank whose wrapper is gone)."""
    import sys

    from orchestrator.backends.base import AttemptRef
    from orchestrator.backends.local import LocalBackend

    token = "feedc0de00000001"
    env = {**os.environ, protocol.ENV_TOKEN: token}
    relaunch = subprocess.Popen(  # argv as the job wrapper's: ``-m orchestrator.jobside.wrapper --run-dir ...``
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '120'])",
         "orchestrator.jobside.wrapper",
         "--run-dir", str(tmp_path)], env=env, start_new_session=True)
    orphan = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)  # the stale launch's own rank
    stale = subprocess.Popen(["true"], start_new_session=True)
    ticks = proctable.read_proc(stale.pid).start_ticks
    stale.wait()
    try:
        program = wait_for(lambda: [p for p in proctable.all_procs() if p.ppid == relaunch.pid], 30,
                           "the relaunch's program")[0]
        ref = AttemptRef(format_id(stale.pid, ticks, proctable.namespaces()), token, tmp_path, 1)
        LocalBackend().cancel([ref])
        wait_for(lambda: orphan.poll() is not None, 30, "the stale launch's orphan to be stopped")
        assert relaunch.poll() is None and proctable.read_proc(program.pid) is not None  # the relaunch untouched
    finally:
        for p in (relaunch, orphan):
            os.killpg(p.pid, signal.SIGKILL) if p.poll() is None else None
            p.wait()
