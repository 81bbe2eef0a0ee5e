"""Nothing the job writes is trusted blindly: a job-written file that is not what orch
expects (a FIFO nobody writes, out-of-range or non-finite numbers, 50 MB, a symlink to /dev/zero,
a directory) never blocks or stops the reconcile pass, `orch status` or `orch show` for any job,
and never leaves the bad job itself stuck once its process is gone.

Several bad jobs share one ORCH_HOME with a healthy job `ok`, as on a real controller. Auto-requeue
is switched off (orch.toml) so each bad job settles after its first attempt instead of looping.

The FIFO case runs end to end through the CLI with real jobs (the job wrapper reads the kit's records
too). The out-of-range matrix (4 files x 8 kinds) runs in-process (to save CI time): the same garbage
files in real run dirs, read by the same passes and views -- the reconcile pass (heartbeat while running;
exit.json, failure.json, the done marker and run_config.json at the end), `orch status` and `orch show`
(click's CliRunner) -- with a fake only at the scheduler boundary, which says running, then exited.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import advjob
import pytest
from advkit import (
    assert_no_stuck,
    job_argv,
    orch_parallel,
    reconcile_ok,
    settle,
    status_map,
    wait_no_procs,
)
from orchkit import Orch, fake_scheduler, use_backend, wait_for

from orchestrator import protocol
from orchestrator.core.config import load_config
from orchestrator.core.db import Database
from orchestrator.ops.reconcile import reconcile_pass
from orchestrator.ops.submit import SubmitRequest, submit

CONFIG = "[policy]\nauto_requeue = []\n"
# wrong_type: a string where a number belongs (progress.json's "samples" made `orch status` raise).
JSON_KINDS = ("huge_float", "huge_int", "nan", "negative", "wrong_type", "big", "devzero", "directory")


def _job_args(fname: str, kind: str) -> list[str]:
    """What the bad job does with ``fname``: garbage at start, then (after go) end so that orch reads it."""
    g = f"{fname}:{kind}"
    if fname == "exit.json":  # orch's wrapper rewrites exit.json at exit: a child of the job rewrites it after
        return ["--garbage", g, "--late-garbage", g, "--exit-code", "1"]
    if fname == "run_config.json":  # read by the NaN rollback policy: report a nan so that it runs
        return ["--garbage", g, "--failure", "nan", "--exit-code", "3"]
    if fname == "failure.json":
        return ["--garbage", g, "--exit-code", "3"]
    return ["--garbage", g, "--exit-code", "1"]  # done.json, progress.json (read while running), wrapper.json


def _run_hostile(orch, bad: dict[str, list[str]]) -> None:
    orch.write_config(CONFIG)
    submits = [["submit", "--name", "ok", "--outputs", "o.txt", "--", "sh", "-c", "echo x > o.txt"]]
    submits += [["submit", "--name", name, "--", *job_argv(*args)] for name, args in bad.items()]
    for p in orch_parallel(orch, submits, timeout=60):
        assert p.returncode == 0, (p.args[:3], p.stdout, p.stderr)
    runs = {name: orch.runs / name for name in bad}
    for name, run in runs.items():
        wait_for((run / "started").exists, 30, f"{name} to write its garbage")

    # While the bad jobs run with their garbage in place.
    reconcile_ok(orch)
    reconcile_ok(orch)
    _views_work(orch, bad)  # while the garbage is read by passes over running jobs

    for run in runs.values():
        (run / "go").touch()
    for name, run in runs.items():
        wait_no_procs(run, 40, f"of {name} after go")
    rows = settle(orch, timeout=60)

    assert rows["ok"]["state"] == "done_marker_verified", rows["ok"]
    for name in bad:
        assert rows[name]["state"] in ("retryable_failed", "failed"), (name, rows[name])
    _views_work(orch, bad)
    assert_no_stuck(orch)  # also: `orch show NAME --json` exits 0 for every job


def _views_work(orch, bad: dict) -> None:
    """`orch status --json` and `orch status` exit 0 and list every job (`show` is checked at the end)."""
    rows = status_map(orch)
    assert set(rows) == {"ok", *bad}, sorted(rows)
    plain = orch("status", timeout=30)
    assert plain.returncode == 0, plain.stderr
    for name in ("ok", *bad):
        assert name in plain.stdout, (name, plain.stdout)


def test_fifos_named_like_job_files_never_block_any_pass(orch):
    """A FIFO named done.json/failure.json/progress.json blocked forever (also exit.json,
    wrapper.json)."""
    _run_hostile(orch, {f"bad-{f.split('.')[0]}": _job_args(f, "fifo")
                        for f in ("done.json", "failure.json", "progress.json", "exit.json", "wrapper.json",
                                  "complete.json", "stop.json")})  # the kit's records, read at exit


def _bounded(fn: Callable[[], object], what: str, timeout: float = 30) -> object:
    """``fn()``, failing the test if it does not return within ``timeout`` (a read that blocks or never
    ends would otherwise hang the whole session instead of failing this test)."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(v=fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{what} did not return within {timeout}s (a read blocked)"
    return out.get("v")


def _views_work_inproc(orch: Orch, names: set[str]) -> None:
    """`orch status --json`, `orch status` and `orch show NAME --json` exit 0 and list every job."""
    for args in (["status", "--json"], ["status"], *(["show", n, "--json"] for n in sorted(names))):
        p = _bounded(lambda a=args: orch.cli(*a), f"orch {' '.join(args)}")
        assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
        if args[0] == "status":
            assert all(n in p.stdout for n in names), (args, p.stdout)


def _garbage(run: Path, token: str, fname: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bad job's garbage, made by advjob's own code (the job's environment, as the wrapper sets it)."""
    with monkeypatch.context() as m:
        for k, v in (("ORCH_RUN_DIR", run), ("ORCH_JOB_NAME", run.name), ("ORCH_ATTEMPT", "1"),
                     ("ORCH_SUBMIT_TOKEN", token)):
            m.setenv(k, str(v))
        advjob.make_garbage(fname, kind)
        if fname == "run_config.json":  # read by the NaN rollback policy: report a nan so that it runs
            protocol.write_failure(run, 1, "nan", 5, "hostile job's own report")


@pytest.mark.parametrize("fname", ["exit.json", "progress.json", "run_config.json", "failure.json"])
def test_out_of_range_json_in_a_job_file_never_stops_the_pass_or_sticks_the_job(orch, fname, monkeypatch):
    """A huge integer or NaN in exit.json/run_config.json left a job submitted forever;
    one bad progress.json made orch status fail for all jobs."""
    orch.write_config(CONFIG)
    bad = {f"bad-{kind.replace('_', '-')}": kind for kind in JSON_KINDS}
    codes = {"ok": 0, **{n: 3 if fname in ("run_config.json", "failure.json") else 1 for n in bad}}
    sched = fake_scheduler()  # every attempt running until sched.ended names its exit code
    use_backend(monkeypatch, sched)
    for k in [k for k in os.environ if k.startswith(("ORCH_", "SLURM_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("ORCH_HOME", str(orch.home))
    cfg = load_config()
    db = Database(cfg)
    try:
        for name in codes:
            submit(db, cfg, SubmitRequest(name=name, command=["true"], outputs=["o.txt"] if name == "ok" else []))
        for name, kind in bad.items():
            _garbage(orch.runs / name, sched.tokens[name], fname, kind, monkeypatch)

        def one_pass() -> None:
            _bounded(lambda: reconcile_pass(db, cfg, backend_for=lambda _n: sched), "the reconcile pass")

        one_pass()  # while the bad jobs run with their garbage in place
        _views_work_inproc(orch, set(codes))

        ok = orch.runs / "ok"
        (ok / "o.txt").write_text("x\n")
        protocol.write_done_marker(ok, "ok", 1, ["o.txt"])  # what the wrapper does after the ok job's exit 0
        sched.ended.update(codes)
        one_pass()
        one_pass()
        rows = {r["name"]: r for r in json.loads(orch.cli("status", "--json").stdout)}
        assert rows["ok"]["state"] == "done_marker_verified", rows["ok"]
        for name in bad:
            assert rows[name]["state"] in ("retryable_failed", "failed"), (name, rows[name])
        _views_work_inproc(orch, set(codes))
    finally:
        db.engine.dispose()
