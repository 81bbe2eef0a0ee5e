"""Issue 9, "nothing the job writes is trusted blindly": a job-written file that is not what orch
expects (a FIFO nobody writes, out-of-range or non-finite numbers, 50 MB, a symlink to /dev/zero,
a directory) never blocks or stops the reconcile pass, `orch status` or `orch show` for any job,
and never leaves the bad job itself stuck once its process is gone.

Several bad jobs share one ORCH_HOME with a healthy job `ok`, as on a real controller. Auto-requeue
is switched off (orch.toml) so each bad job settles after its first attempt instead of looping.
"""

from __future__ import annotations

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
from orchkit import wait_for

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


def _run_hostile(orch, bad: dict[str, list[str]]) -> None:  # noqa: ANN001
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


def _views_work(orch, bad: dict) -> None:  # noqa: ANN001
    """`orch status --json` and `orch status` exit 0 and list every job (`show` is checked at the end)."""
    rows = status_map(orch)
    assert set(rows) == {"ok", *bad}, sorted(rows)
    plain = orch("status", timeout=30)
    assert plain.returncode == 0, plain.stderr
    for name in ("ok", *bad):
        assert name in plain.stdout, (name, plain.stdout)


def test_fifos_named_like_job_files_never_block_any_pass(orch):
    """Issue 9: 'a FIFO named done.json/failure.json/progress.json blocks forever' (also exit.json,
    wrapper.json)."""
    _run_hostile(orch, {f"bad-{f.split('.')[0]}": _job_args(f, "fifo")
                        for f in ("done.json", "failure.json", "progress.json", "exit.json", "wrapper.json",
                                  "complete.json", "stop.json")})  # issue 17: the kit's records, read at exit


@pytest.mark.parametrize("fname", ["exit.json", "progress.json", "run_config.json", "failure.json"])
def test_out_of_range_json_in_a_job_file_never_stops_the_pass_or_sticks_the_job(orch, fname):
    """Issue 9: 'a huge integer or NaN in exit.json/run_config.json leaves a job submitted forever;
    one bad progress.json makes orch status fail for all jobs'."""
    _run_hostile(orch, {f"bad-{kind.replace('_', '-')}": _job_args(fname, kind) for kind in JSON_KINDS})
