"""Exit codes: user errors exit 2 with one line (no traceback), a closed stdout
pipe exits quietly, and `requeue` of several jobs exits non-zero when any of them errored."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess

import pytest
from advkit import (
    PY,
    ROOT,
    assert_no_stuck,
    assert_user_error,
    db_job_names,
    job_argv,
    live_job_procs,
    settle,
    show,
)
from orchkit import tree_hash, wait_for

LONG = "a-job-with-a-long-name-" + "x" * 97  # 120 characters: 600 rows overflow a 64 KiB pipe buffer


def _clone_jobs(orch, name: str, count: int) -> None:
    """``count`` copies of job ``name``'s row (schema-agnostic: every column but id is copied).

    Submitting 600 jobs through the CLI would take minutes on 2 cores; the rows are what `status`
    reads, so the copies are as real to it as submitted jobs."""
    with sqlite3.connect(orch.home / "orch.db") as c:
        cols = [r[1] for r in c.execute("PRAGMA table_info(jobs)") if r[1] != "id"]
        row = dict(zip(cols, c.execute(f"SELECT {', '.join(cols)} FROM jobs WHERE name = ?", (name,)).fetchone(),
                       strict=True))
        marks = ", ".join("?" for _ in cols)
        for i in range(count):
            n = f"{name}-{i:04d}"
            vals = {**row, "name": n, "run_dir": str(orch.runs / n)}
            c.execute(f"INSERT INTO jobs ({', '.join(cols)}) VALUES ({marks})", [vals[k] for k in cols])


@pytest.mark.parametrize("args", [["status"], ["status", "--json"]], ids=["table", "json"])
def test_status_into_a_closed_pipe_exits_quietly(orch, tmp_path, args):
    """Some user errors ended in exit 1 with a traceback (`| head` BrokenPipe ...)."""
    p = orch("submit", "--name", LONG, "--outputs", "o", "--", "sh", "-c", "echo x > o")
    assert p.returncode == 0, p.stderr
    rows = settle(orch, [LONG])
    assert rows[LONG]["state"] == "done_marker_verified", rows[LONG]
    _clone_jobs(orch, LONG, 600)
    errf = tmp_path / "orch-stderr"
    script = '"$0" -m orchestrator.cli "$@" 2>"$ERRF" | head -1; echo "orch-exit=${PIPESTATUS[0]}"'
    r = subprocess.run(["bash", "-c", script, PY, *args], env={**orch.env, "ERRF": str(errf)}, cwd=str(ROOT),
                       capture_output=True, text=True, timeout=60)
    first, *rest = r.stdout.splitlines()
    assert first.startswith(("NAME", "[")), r.stdout
    err = errf.read_text()
    assert "Traceback" not in err and "BrokenPipe" not in err and "unexpected error" not in err, err
    assert rest and rest[-1] in ("orch-exit=0", "orch-exit=141"), (rest[-1:], err)  # 0: it all fit the pipe


def test_verify_into_a_closed_pipe_never_exits_0_for_an_unverified_job(orch, tmp_path):
    # Found by a hostile test: the reader gone, `orch verify` exited 0 (success) for an ABSENT marker.
    p = orch("submit", "--name", "nv", "--", "sh", "-c", "exit 1")
    assert p.returncode == 0, p.stderr
    script = '"$0" -m orchestrator.cli verify nv | (exec 0<&-; sleep 0.5); echo "orch-exit=${PIPESTATUS[0]}"'
    r = subprocess.run(["bash", "-c", script, PY], env=orch.env, cwd=str(ROOT), capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == "orch-exit=141", r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "unexpected error" not in r.stderr, r.stderr


@pytest.mark.parametrize("mem", ["4\uff27", "4\u212a"], ids=["fullwidth-G", "kelvin-sign-K"])
def test_a_non_ascii_mem_unit_is_a_one_line_usage_error(orch, mem):
    """A --mem unit that is not ASCII ended in exit 1 (the Kelvin sign matched [K] under re.I)."""
    p = orch.cli("submit", "--name", "m", "--mem", mem, "--", "true")
    assert_user_error(p, (2,), r"mem")
    assert db_job_names(orch.home) == []


@pytest.mark.parametrize("root", ["~nosuchuser/runs", "/tmp/a\\u0000b"], ids=["unknown-user", "nul-byte"])
def test_a_runs_root_that_cannot_be_a_path_is_a_one_line_usage_error(orch, root):
    """A runs root with ~nosuchuser or a NUL byte ended in exit 1."""
    orch.write_config(f'[runs]\nroot = "{root}"\n')
    p = orch.cli("submit", "--name", "r", "--", "true")
    assert_user_error(p, (2,), r"runs|root|orch\.toml")
    assert db_job_names(orch.home) == []
    s = orch.cli("status")
    assert s.returncode in (0, 2), (s.returncode, s.stderr)
    if s.returncode:
        assert_user_error(s, (2,))


@pytest.mark.parametrize("breakage", ["run-dir-symlink", "trash-is-a-file"])
def test_requeue_of_several_jobs_exits_non_zero_when_one_of_them_errors(orch, tmp_path, breakage):
    """A launch error made requeue print "error" yet exit 0."""
    for name in ("broken", "fine"):
        p = orch("submit", "--name", name, "--", *job_argv("--no-gate", "--exit-code", "1"))
        assert p.returncode == 0, p.stderr
    rows = settle(orch, ["broken", "fine"])
    assert {rows[n]["state"] for n in ("broken", "fine")} == {"retryable_failed"}, rows
    run = orch.runs / "broken"
    moved = tmp_path / "moved-broken"
    if breakage == "run-dir-symlink":
        os.rename(run, moved)
        run.symlink_to(moved)
        before = tree_hash(moved)
    else:  # a leftover to trash, and a trash orch cannot create (a regular file in its place)
        (run / "result").mkdir(exist_ok=True)
        (orch.home / "trash").mkdir(exist_ok=True)
        (orch.home / "trash" / "broken").write_text("a regular file where orch wants a directory\n")

    r = orch("requeue", "broken", "fine")
    assert r.returncode in (1, 3), f"requeue exited {r.returncode} although `broken` failed:\n{r.stdout}{r.stderr}"
    assert re.search(r"broken", r.stdout + r.stderr), r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert len(show(orch, "fine")["attempts"]) == 2, "the healthy job was not requeued"
    settle(orch)
    assert_no_stuck(orch)
    if breakage == "run-dir-symlink":
        assert tree_hash(moved) == before, "orch wrote through a symlinked run dir"


@pytest.mark.parametrize("home, char", [("a%b", "'%'"), ("x/y?mode=ro", "'?'"), ("n\nl", "'\\n'")],
                         ids=["percent", "query", "newline"])
def test_an_orch_home_the_db_url_would_misread_is_a_one_line_usage_error(orch, tmp_path, home, char):
    # Found by a hostile test: `%` broke Alembic's config (exit 1), and `?mode=ro` created the SQLite file
    # /x/y, outside ORCH_HOME.
    p = orch.cli("status", env={"ORCH_HOME": str(tmp_path / home)})
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.startswith("orch: ORCH_HOME ") and f"contains {char}: not supported" in p.stderr, p.stderr
    assert len(p.stderr.splitlines()) == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://", "sqlite:///:memory:"])
def test_an_orch_db_url_without_a_file_is_a_one_line_usage_error(orch, url):
    p = orch.cli("status", env={"ORCH_DB_URL": url})
    assert (p.returncode, p.stderr) == (2, "orch: ORCH_DB_URL names no SQLite file (in-memory or empty): the job "
                                           "table would vanish at exit; name a file, e.g. sqlite:////home/me/orch.db\n")


def test_a_fifo_as_sweep_params_or_a_device_as_metrics_dir_is_a_usage_error(orch, tmp_path):
    # Found by a hostile test: `sweep --from FIFO` blocked for ever; `metrics --textfile /dev/null` exited 1.
    fifo = tmp_path / "params.jsonl"
    os.mkfifo(fifo)
    p = orch.cli("sweep", "--name", "ff", "--from", fifo, "--", "true")
    assert (p.returncode, p.stderr) == (2, f"orch: --from {fifo} is not a regular file\n")
    p = orch.cli("metrics", "--textfile", "/dev/null")
    assert (p.returncode, p.stderr) == (2, "orch: --textfile /dev/null: not a directory\n")
    assert json.loads(orch.cli("status", "--json").stdout) == []


def test_a_misspelt_orch_toml_table_is_a_usage_error_not_silently_ignored(orch):
    orch.write_config("[polcy]\nmax_attempts = 5\n")
    p = orch.cli("status")
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert "orch.toml: unknown table or key 'polcy'; orch.toml has [metrics], [nodes], [policy], [reconcile], " \
           "[runs], [spot]" in p.stderr, p.stderr


def test_a_misspelt_key_in_a_known_orch_toml_table_is_a_usage_error(orch):
    # `[policy] max_atempts = 2` was silently ignored, and the job got 3 attempts.
    orch.write_config("[policy]\nmax_atempts = 2\n")
    p = orch.cli("status")
    assert (p.returncode, p.stdout) == (2, ""), p.stderr
    assert p.stderr == (f"orch: {orch.home / 'orch.toml'}: unknown key 'max_atempts' in [policy]; [policy] has "
                        "auto_requeue, backoff_cap_s, caps, crash_backoff_s, hang_timeout_s, input_missing_attempts, "
                        "keep_last_k, max_attempts, nan_lr_factor, nan_rollback_steps, no_progress_attempts, "
                        "oom_mem_cap_mb, oom_mem_factor, slow_factor, uncounted\n"), p.stderr
    assert not (orch.home / "orch.db").exists()


@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "to-a-file"])
def test_a_symlink_at_the_db_path_is_refused_and_nothing_is_written_outside_orch_home(orch, tmp_path, dangling):
    # Hostile test: a dangling orch.db link made every command create the DB at its target.
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "target.db"
    if not dangling:
        target.write_bytes(b"")
    orch.home.mkdir(mode=0o700)
    (orch.home / "orch.db").symlink_to(target)
    before = tree_hash(outside)
    p = orch("status")
    assert (p.returncode, p.stderr) == (2, f"orch: {orch.home / 'orch.db'} is a symlink; orch keeps its DB in "
                                           "ORCH_HOME (set ORCH_DB_URL to use one elsewhere)\n")
    assert tree_hash(outside) == before and target.exists() != dangling


@pytest.mark.parametrize("command", [("status",), ("report", "--since", "all")])
def test_a_symlink_to_a_real_db_is_refused_by_the_read_commands_fast_path_too(orch, tmp_path, command):
    # Hostile test: orch status and orch report read another home's DB through a symlinked orch.db (their
    # quick path followed it) while every other command refused it.
    other = tmp_path / "other-home"
    assert orch("status", env={"ORCH_HOME": str(other)}).returncode == 0  # a real, current, private DB
    orch.home.mkdir(mode=0o700)
    (orch.home / "orch.db").symlink_to(other / "orch.db")
    p = orch(*command)
    assert (p.returncode, p.stdout) == (2, ""), p.stdout + p.stderr
    assert p.stderr == (f"orch: {orch.home / 'orch.db'} is a symlink; orch keeps its DB in ORCH_HOME (set "
                        "ORCH_DB_URL to use one elsewhere)\n")


def test_an_unusable_sweep_launch_lock_is_one_sweeps_error_and_the_pass_goes_on_for_other_jobs(orch):
    # Hostile test: a directory at sweep-launch.lock made every reconcile pass exit 1 before the
    # auto-requeue, so no job was ever requeued again.
    orch.write_config('[policy]\nauto_requeue = ["marker_missing"]\n')
    assert orch("submit", "--name", "plain", "--", "true").returncode == 0
    wait_for(lambda: not live_job_procs(orch.runs / "plain"), 30, "plain's attempt to end")
    (orch.home / "sweep-launch.lock").mkdir()
    p = orch("sweep", "--name", "sw", "--grid", "i=1,2", "--throttle", "1", "--", "true")
    assert p.returncode == 1 and "sweep-launch.lock: Is a directory" in p.stderr, (p.returncode, p.stderr)
    r = orch("reconcile")
    assert r.returncode == 0, r.stderr
    assert "plain: requeued" in r.stdout and "sweep-launch.lock: Is a directory" in r.stderr, (r.stdout, r.stderr)
