"""Keep the promise under stress: strict input, no traceback or wrong exit code on
any job-written value, and the smaller findings. Every test drives the real CLI in a subprocess; each
failed on the code before its fix."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from advkit import PY, ROOT, settle, show
from orchkit import wait_for

BIG_INT = 2**63 - 1


def _nothing_written(orch, name: str) -> None:
    assert not (orch.runs / name).exists(), f"{name}'s run dir exists"
    if (orch.home / "orch.db").exists():
        assert json.loads(orch.cli("status", "--json").stdout) == []


# ------------------------------------------------------------------------------------------
# strict input
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", [["submit", "--name", "t"], ["sweep", "--name", "t", "--grid", "x=1"]])
def test_a_misspelt_option_before_the_command_is_refused_with_a_hint(orch, cmd):
    # Found by a hostile test: exit 0, and the job ran `--max-atempts 2 -- true`.
    p = orch.cli(*cmd, "--max-atempts", "2", "--", "true")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "No such option '--max-atempts'" in p.stderr and "Did you mean '--max-attempts'?" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    _nothing_written(orch, "t")


def test_the_first_positional_ends_orchs_options_with_or_without_dashes(orch):
    orch("submit", "--name", "a", "--", PY, "-c", "pass", "--lr", "1", check=True)
    orch("submit", "--name", "b", PY, "-c", "pass", "--lr", "1", "--", "x", check=True)
    assert show(orch, "a")["command"] == [PY, "-c", "pass", "--lr", "1"]
    assert show(orch, "b")["command"] == [PY, "-c", "pass", "--lr", "1", "--", "x"]


@pytest.mark.parametrize("value, why", [("a\u0000b", "NUL"), ("x" * (128 * 1024 + 1), "128 KiB")],
                         ids=["nul", "oversize"])
def test_sweep_from_refuses_nul_and_oversize_values_at_parse_time(orch, tmp_path, value, why):
    # Found by a hostile test: accepted, then every task failed as `unknown` (execve: E2BIG / a cut argv).
    f = tmp_path / "params.jsonl"
    f.write_text(json.dumps({"x": 1}) + "\n" + json.dumps({"x": value}) + "\n")
    p = orch.cli("sweep", "--name", "sw", "--from", f, "--", "echo", "{x}")
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.startswith(f"orch: {f}:2: ") and why in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    _nothing_written(orch, "sw.0000")


def test_a_relative_sqlite_db_url_is_a_usage_error_and_creates_nothing(orch, tmp_path):
    # Found by a hostile test: sqlite:///relative.db made a DB in whatever directory orch ran from.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**orch.env, "ORCH_DB_URL": "sqlite:///relative.db"}
    p = subprocess.run([PY, "-m", "orchestrator.cli", "status"], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.startswith("orch: ORCH_DB_URL names a relative SQLite path 'relative.db'"), p.stderr
    assert len(p.stderr.splitlines()) == 1 and list(cwd.iterdir()) == []


def test_a_sqlite_db_url_naming_no_regular_file_is_a_usage_error_and_writes_nothing(orch, tmp_path):
    # Hostile test: sqlite:////dev/null made SQLite write /dev/null-journal, and orch its migrate lock, in /dev.
    fifo = tmp_path / "db.fifo"
    os.mkfifo(fifo)
    for target in ("/dev/null", str(fifo), str(tmp_path)):
        before = sorted(os.listdir(os.path.dirname(target) or "/"))
        p = orch("status", env={"ORCH_DB_URL": f"sqlite:///{target}"}, timeout=30)
        assert p.returncode == 2, p.stdout + p.stderr
        assert p.stderr.startswith(f"orch: ORCH_DB_URL names {target!r}, which is not a regular file"), p.stderr
        assert sorted(os.listdir(os.path.dirname(target) or "/")) == before


def test_a_sweep_whose_filled_in_command_is_too_large_to_exec_is_refused_at_parse_time(orch, tmp_path):
    # Hostile test: every value under 128 KiB, but {a} 40 times with a 60 KB value made 2.4 MB of argv: the
    # sweep was accepted and every task then failed `unknown` ("process gone without an exit record").
    params = tmp_path / "a.jsonl"
    params.write_text(json.dumps({"a": "x" * 60_000}) + "\n")
    p = orch.cli("sweep", "--name", "rep", "--from", str(params), "--", "echo", *["{a}"] * 40)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "task 0's command is 2400045 bytes once its values are filled in" in p.stderr, p.stderr
    assert not orch.home.exists() or not (orch.home / "orch.db").exists()


@pytest.mark.parametrize("glob", ["**", "**/*", "[a]ttempts/**", "*", "*.json", ".*", "tensorboard/*",
                                  "checkpoints*/**", "./done.json"])
def test_an_outputs_glob_that_matches_orchs_own_files_is_refused(orch, glob):
    # Found by a hostile test: `--outputs '**'` listed attempts/1/exit.reserve: every attempt marker_corrupt.
    p = orch.cli("submit", "--name", "g", "--outputs", glob, "--", "true")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "orch's own" in p.stderr and "Traceback" not in p.stderr, p.stderr
    _nothing_written(orch, "g")


def test_an_outputs_glob_for_result_files_is_still_accepted(orch):
    p = orch("submit", "--name", "r", "--outputs", "out/**", "--outputs", "*.pt", "--outputs", "result/*",
             "--", "sh", "-c", "mkdir -p out/a && echo x > out/a/b && echo y > m.pt")
    assert p.returncode == 0, p.stderr
    assert settle(orch, ["r"])["r"]["state"] == "done_marker_verified"


# ------------------------------------------------------------------------------------------
# no traceback on any job-written value
# ------------------------------------------------------------------------------------------
EXTREME_JOB = f"""
import json, os
d = os.path.join(os.environ["ORCH_RUN_DIR"], "attempts", os.environ["ORCH_ATTEMPT"])
beats = [{{"step": 0, "loss": -1e308, "time": -1e308}},
         {{"step": 1, "loss": 1e308, "time": 1e308, "max_steps": {BIG_INT}, "tokens_per_s": 1e308,
           "tokens_per_step": 1}},
         {{"step": {BIG_INT - 1}, "loss": 1e308, "time": 1e308, "max_steps": {BIG_INT}}},
         {{"step": {BIG_INT}, "loss": -1e308, "time": 1e308, "max_steps": 1, "tokens_per_s": 1e-308,
           "tokens_per_step": {BIG_INT}}},
         {{"step": {2**70}, "loss": 10**400, "time": -1e308, "max_steps": {2**70}}}]
with open(os.path.join(d, "progress.jsonl"), "w") as f:
    for b in beats:
        f.write(json.dumps(b) + "\\n")
with open(os.path.join(d, "progress.json"), "w") as f:
    json.dump(beats[3], f)
open("o", "w").write("x")
"""


def test_extreme_progress_values_never_crash_watch_wait_plot_or_status(orch, tmp_path):
    # Found by a hostile test: watch/submit --wait exited 1 (OverflowError), plot exited 1 (LinAlgError).
    p = orch("submit", "--name", "x", "--outputs", "o", "--wait", "--", PY, "-c", EXTREME_JOB, timeout=180)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "unexpected" not in p.stderr, p.stderr
    p = orch("watch", "x", "--plain")
    assert p.returncode == 0 and "unexpected" not in p.stderr, p.stdout + p.stderr
    assert "e+308" not in p.stdout and "loss" not in p.stdout, p.stdout  # implausible fields are dropped
    out = tmp_path / "x.png"
    p = orch("plot", "x", "-o", out)
    assert p.returncode == 0 and out.stat().st_size > 0, p.stdout + p.stderr
    p = orch("plot", "x", "--json")
    assert p.returncode == 0, p.stderr
    for s in json.loads(p.stdout)["series"]:
        for step, loss in s["points"]:
            assert 0 <= step < 2**63 and abs(loss) <= 1e300, (step, loss)
    assert orch("status").returncode == 0 and orch("status", "--json").returncode == 0


def test_plot_into_a_place_that_cannot_be_written_is_a_one_line_usage_error(orch):
    orch("submit", "--name", "p", "--outputs", "o", "--wait", "--", "sh", "-c", "echo x > o", check=True,
         timeout=120)
    p = orch("plot", "p", "-o", "/proc/x.png")
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.startswith("orch: cannot write /proc/x.png: ") and len(p.stderr.splitlines()) == 1, p.stderr


def _clone_jobs(orch, name: str, count: int) -> None:
    """``count`` copies of job ``name``'s row (every column but id copied): a large listing in seconds."""
    with sqlite3.connect(orch.home / "orch.db") as c:
        cols = [r[1] for r in c.execute("PRAGMA table_info(jobs)") if r[1] != "id"]
        row = dict(zip(cols, c.execute(f"SELECT {', '.join(cols)} FROM jobs WHERE name = ?", (name,)).fetchone(),
                       strict=True))
        marks = ", ".join("?" for _ in cols)
        for i in range(count):
            n = f"{name}-{i:04d}-" + "y" * 100
            vals = {**row, "name": n, "run_dir": str(orch.runs / n)}
            c.execute(f"INSERT INTO jobs ({', '.join(cols)}) VALUES ({marks})", [vals[k] for k in cols])


def _into_closed_pipe(orch, *args: str) -> subprocess.CompletedProcess:
    """Run orch with stdout a pipe whose reader is already gone (the `| true` that exits first)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([PY, "-m", "orchestrator.cli", *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              env=orch.env, cwd=str(ROOT), timeout=60)
    finally:
        os.close(w)


def _read_one_line_then_close(orch, *args: str) -> tuple[int, str]:
    """`orch ... | head -1`: read one line, close the pipe, let orch run on into it."""
    p = subprocess.Popen([PY, "-m", "orchestrator.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=orch.env, cwd=str(ROOT))
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert first, err
    return p.wait(timeout=60), err


@pytest.mark.parametrize("args", [["--help"], ["submit", "--help"], ["--version"], ["status"], ["status", "--json"],
                                  ["show", "j"], ["verify", "j"], ["status", "--tasks"], ["logs", "j"]])
def test_every_command_exits_141_into_a_closed_pipe(orch, args):
    # Found by a hostile test: `orch --help | true` exited 1.
    orch("submit", "--name", "j", "--outputs", "o", "--wait", "--", "sh", "-c", "echo x > o", check=True,
         timeout=120)
    p = _into_closed_pipe(orch, *args)
    assert p.returncode == 141, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr


@pytest.mark.parametrize("args", [["status", "--tasks"], ["status", "--json"]])
def test_a_large_status_listing_into_head_1_exits_141(orch, args):
    # Found by a hostile test: `orch status --tasks | head -1` exited 0 when the output was large.
    orch("submit", "--name", "big", "--outputs", "o", "--wait", "--", "sh", "-c", "echo x > o", check=True,
         timeout=120)
    _clone_jobs(orch, "big", 1500)
    orch("status", check=True)  # warm
    rc, err = _read_one_line_then_close(orch, *args)
    assert rc == 141, (rc, err)
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_a_hand_edited_status_cache_never_runs_its_sql(orch, tmp_path):
    # Found by a hostile test: the quick path ran whatever SQL cache/status-sql.json held (ATTACH made files).
    orch("submit", "--name", "c", "--", "true", check=True)
    orch("status", check=True)
    orch("status", check=True)
    cache = orch.home / "cache" / "status-sql.json"
    entry = json.loads(cache.read_text()) if cache.exists() else {"all": {"params": 0, "keys": ["x"]}}
    evil = tmp_path / "evil.db"
    for sql in (f"ATTACH DATABASE '{evil}' AS evil", "SELECT 1 AS x WHERE 0"):
        entry["all"] = {**entry["all"], "sql": sql}
        cache.parent.mkdir(exist_ok=True)
        cache.write_text(json.dumps(entry))
        p = orch("status")
        assert p.returncode == 0 and "c " in p.stdout + " ", p.stdout + p.stderr
        assert "no jobs" not in p.stdout and not evil.exists(), p.stdout


# ------------------------------------------------------------------------------------------
# smaller
# ------------------------------------------------------------------------------------------
HEARTBEAT_THEN_HANG = """
import os, time
from orchestrator import protocol
protocol.write_progress(os.environ["ORCH_RUN_DIR"], int(os.environ["ORCH_ATTEMPT"]), step=3)
time.sleep(600)
"""


def test_a_hung_job_whose_heartbeat_is_dated_in_the_future_is_still_judged_hung(orch):
    # Found by a hostile test: a progress.json with a future mtime counted as fresh for ever.
    orch.write_config("[policy]\nhang_timeout_s = 3\nmax_attempts = 1\n")
    orch("submit", "--name", "h", "--", PY, "-c", HEARTBEAT_THEN_HANG, check=True)
    beat = orch.runs / "h" / "attempts" / "1" / "progress.json"
    wait_for(beat.exists, 60, "the first heartbeat")
    future = time.time() + 30 * 86400
    os.utime(beat, (future, future))

    def judged_hung() -> bool:
        orch("reconcile", check=True)
        a = show(orch, "h")["attempts"][0]
        return a["failure_class"] == "hang" or a.get("stop_reason") == "hang"

    wait_for(judged_hung, 90, "h judged hung", interval=0.5, detail=lambda: show(orch, "h"))


def test_status_says_a_cancelled_job_is_still_stopping(orch):
    # Found by a hostile test: `cancelled` while its process still ran.
    orch("submit", "--name", "s", "--", "sh", "-c", "trap '' TERM; echo up > up; while :; do sleep 0.2; done",
         check=True)
    wait_for(lambda: (orch.runs / "s" / "up").exists(), 60, "the job to start")
    orch("reconcile", check=True)
    orch("cancel", "s", check=True)
    row = next(r for r in orch.json("status") if r["name"] == "s")
    assert (row["state"], row["attempt_state"]) == ("cancelled", "stopping"), row
    table = orch("status", check=True).stdout
    assert "cancelled (stopping)" in table, table


CONTROL_JOB = r"""
import json, os, sys
d = os.path.join(os.environ["ORCH_RUN_DIR"], "attempts", os.environ["ORCH_ATTEMPT"])
json.dump({"class": "crash", "step": 1, "detail": "boom\x1b[2J\x1b]0;pwned\x07\r\nline two\x9b"},
          open(os.path.join(d, "failure.json"), "w"))
sys.exit(1)
"""


def test_show_escapes_control_characters_from_job_written_text(orch):
    orch("submit", "--name", "cc", "--max-attempts", "1", "--", PY, "-c", CONTROL_JOB, check=True)
    settle(orch, ["cc"])
    d = orch.show("cc")  # --json stays exact
    assert "\x1b[2J" in d["attempts"][0]["detail"], d
    out = orch("show", "cc", check=True).stdout
    assert not any(c in out for c in "\x1b\x07\r\x9b"), repr(out)
    assert "boom\\x1b[2J" in out, out


def test_requeue_of_a_sweep_reverifies_its_done_tasks(orch):
    # Found by a hostile test: `orch requeue SWEEP` skipped done tasks whose output had been damaged.
    orch("sweep", "--name", "sw", "--grid", "x=1,2", "--outputs", "o", "--", "sh", "-c", "echo {x} > o",
         check=True)
    rows = settle(orch, ["sw.0000", "sw.0001"])
    assert {r["state"] for r in rows.values()} == {"done_marker_verified"}, rows
    (orch.runs / "sw.0000" / "o").write_text("damaged\n")
    p = orch("requeue", "sw")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "sw.0000: requeued" in p.stdout, p.stdout
    rows = settle(orch, ["sw.0000", "sw.0001"])
    assert rows["sw.0000"]["state"] == rows["sw.0001"]["state"] == "done_marker_verified", rows
    assert (orch.runs / "sw.0000" / "o").read_text() == "1\n"
    assert len(show(orch, "sw.0001")["attempts"]) == 1  # a verified task is never rerun


def _lose_db(orch) -> None:
    for f in ("orch.db", "orch.db-wal", "orch.db-shm"):
        (orch.home / f).unlink(missing_ok=True)


def test_a_resubmitted_sweep_adopts_a_verified_task_only_with_identical_params(orch):
    # Found by a hostile test: other parameters, a program reading ORCH_SWEEP_PARAMS, and the old results
    # were recorded done.
    cmd = ["--outputs", "o", "--", "sh", "-c", 'echo "$ORCH_SWEEP_PARAMS" > o']
    orch("sweep", "--name", "ps", "--grid", "lr=1", *cmd, check=True)
    assert settle(orch, ["ps.0000"])["ps.0000"]["state"] == "done_marker_verified"
    _lose_db(orch)
    before = sorted(str(p) for p in orch.runs.rglob("*"))
    p = orch("sweep", "--name", "ps", "--grid", "lr=2", *cmd)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "refused: ps.0000: " in p.stderr and "parameters" in p.stderr and len(p.stderr.splitlines()) == 1
    assert sorted(str(p) for p in orch.runs.rglob("*")) == before and orch.json("status") == []
    p = orch("sweep", "--name", "ps", "--grid", "lr=1", "--grid", "seed=1", *cmd)
    assert p.returncode == 3, p.stdout + p.stderr
    # the same parameters: adopted, never rerun
    p = orch("sweep", "--name", "ps", "--grid", "lr=1", *cmd)
    assert p.returncode == 3 and "already holds a verified done marker" in p.stderr, p.stderr


def test_a_resubmitted_sweep_adopts_identical_tasks_and_runs_the_new_ones(orch):
    cmd = ["--outputs", "o", "--", "sh", "-c", 'echo "$ORCH_SWEEP_PARAMS" > o']
    orch("sweep", "--name", "pa", "--from", _params(orch, [{"lr": 1}]), *cmd, check=True)
    assert settle(orch, ["pa.0000"])["pa.0000"]["state"] == "done_marker_verified"
    _lose_db(orch)
    orch("sweep", "--name", "pa", "--from", _params(orch, [{"lr": 1}, {"lr": 2}]), *cmd, check=True)
    rows = settle(orch, ["pa.0000", "pa.0001"])
    assert {r["state"] for r in rows.values()} == {"done_marker_verified"}
    assert show(orch, "pa.0000")["attempts"] == []  # adopted: recorded done, not rerun


def _params(orch, sets: list[dict]) -> Path:
    f = orch.home.parent / f"params-{time.monotonic_ns()}.jsonl"
    f.write_text("".join(json.dumps(s) + "\n" for s in sets))
    return f


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
