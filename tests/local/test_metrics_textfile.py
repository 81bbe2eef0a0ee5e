"""`orch metrics`: the textfile node_exporter reads, parsed back with prometheus_client's own parser,
equals what the DB holds, after real local jobs reached several states; written atomically."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from localkit import db_rows, wrapper_record
from orchkit import wait_for, wait_for_file
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import protocol
from orchestrator.core.lifecycle import JobState
from orchestrator.protocol import FAILURE_CLASSES

# A bring-your-own program as a preemption sees it: attempt 1 reaches step 10, saves step 8 and
# reports "preempted" (exit 143); attempt 2 resumes from step 8 (its heartbeat says so) and finishes.
PREEMPTED_ONCE = r"""
import os, sys
from orchestrator import protocol
run, n = os.environ["ORCH_RUN_DIR"], int(os.environ["ORCH_ATTEMPT"])
if n == 1:
    protocol.write_progress(run, 1, step=10, resumed_from=0)
    protocol.write_failure(run, 1, "preempted", 8, "SIGTERM: saved step 8")
    sys.exit(143)
protocol.write_progress(run, n, step=12, resumed_from=8)
os.makedirs("result", exist_ok=True)
open("result/out.txt", "w").write("ok")
"""


def scrape(path: Path) -> dict[str, dict[tuple, float]]:
    return scrape_stdout(path.read_text())


def scrape_stdout(text: str) -> dict[str, dict[tuple, float]]:
    """family name -> {(sample name, sorted labels): value}, as a Prometheus server would read it."""
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}
    return out


def labelled(m: dict[str, dict[tuple, float]], family: str, label: str) -> dict[str, float]:
    return {dict(k[1])[label]: v for k, v in m[family].items()}


def value(m: dict[str, dict[tuple, float]], family: str, sample: str | None = None) -> float:
    return m[family][(sample or family, ())]


@pytest.fixture
def textfile_dir(orch, tmp_path: Path) -> Path:
    d = tmp_path / "textfile"
    d.mkdir()
    orch.write_config(f'[metrics]\ntextfile_dir = "{d}"\n')
    return d


def test_textfile_written_by_reconcile_equals_the_db_after_jobs_in_several_states(orch, textfile_dir):
    orch("submit", "--name", "ok", "--outputs", "result/*", "--", "sh", "-c",
         "mkdir -p result && echo ok > result/out.txt", check=True)
    orch("submit", "--name", "nomarker", "--", "true", check=True)
    orch("submit", "--name", "crash", "--max-attempts", "1", "--", "sh", "-c", "exit 3", check=True)
    orch("submit", "--name", "pre", "--outputs", "result/*", "--", sys.executable, "-c", PREEMPTED_ONCE,
         check=True)
    orch("submit", "--name", "runs", "--", "sleep", "600", check=True)
    orch("submit", "--name", "gone", "--", "sleep", "600", check=True)
    try:
        orch.wait("ok", {"done_marker_verified"}, timeout=60)
        orch.wait("nomarker", {"retryable_failed"}, timeout=60)
        orch.wait("crash", {"failed"}, timeout=60)
        orch.wait("pre", {"done_marker_verified"}, timeout=90)
        orch.wait("runs", {"running"}, timeout=60)
        orch("cancel", "gone", check=True)
        orch.wait("gone", {"cancelled"}, timeout=90)
        orch("reconcile", check=True)  # the file is the one this pass wrote

        prom = textfile_dir / "orch.prom"
        m = scrape(prom)
        jobs = labelled(m, "orch_jobs", "state")
        assert set(jobs) == {s.value for s in JobState}  # every state, even those with no job
        stored = dict(db_rows(orch.home, "SELECT state, count(*) FROM jobs GROUP BY state"))
        assert jobs == {s.value: float(stored.get(s.value, 0)) for s in JobState}
        assert (jobs["done_marker_verified"], jobs["running"], jobs["cancelled"], jobs["failed"],
                jobs["retryable_failed"]) == (2, 1, 1, 1, 1)

        failures = labelled(m, "orch_attempt_failures", "class")
        assert set(failures) == set(FAILURE_CLASSES)
        stored = dict(db_rows(orch.home, "SELECT failure_class, count(*) FROM attempts "
                                         "WHERE failure_class IS NOT NULL GROUP BY failure_class"))
        assert failures == {c: float(stored.get(c, 0)) for c in FAILURE_CLASSES}
        assert (failures["preempted"], failures["marker_missing"], failures["crash"],
                failures["cancelled"]) == (1, 1, 1, 1)

        # the last success is the newest "-> done_marker_verified" event (a source the code does not read)
        (last,), = db_rows(orch.home, "SELECT max(at) FROM events WHERE to_state = 'done_marker_verified'")
        last = datetime.fromisoformat(last).replace(tzinfo=UTC).timestamp()
        assert value(m, "orch_last_success_timestamp_seconds") == pytest.approx(last, abs=1e-3)

        # pre: attempt 1 reached step 10 and saved 8; attempt 2 resumed from 8 -> 2 steps redone
        assert value(m, "orch_preemption_steps_redone", "orch_preemption_steps_redone_count") == 1
        assert value(m, "orch_preemption_steps_redone", "orch_preemption_steps_redone_sum") == 2
        assert value(m, "orch_preemptions_unmeasured") == 0

        passes = value(m, "orch_reconcile_passes", "orch_reconcile_passes_total")
        assert passes >= orch.reconcile_runs >= 2  # each `orch reconcile` above held the lease: no other ran
        assert 0 < value(m, "orch_reconcile_last_pass_duration_seconds") < 60
        assert value(m, "orch_reconcile_last_pass_scheduler_query_failures") == 0
        assert value(m, "orch_scheduler_query_failures", "orch_scheduler_query_failures_total") == 0
        # world-readable whatever orch's umask: node_exporter runs as another user
        assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    finally:
        orch("cancel", "runs")


def test_the_textfile_is_replaced_by_rename_never_rewritten_in_place(orch, textfile_dir):
    orch("reconcile", check=True)
    prom = textfile_dir / "orch.prom"
    wait_for_file(prom)
    first = os.stat(prom)
    held = open(prom)  # a reader that opened the old file keeps reading the old, whole file
    try:
        old_text = held.read()
        orch("submit", "--name", "j", "--outputs", "o.txt", "--", "sh", "-c", "echo x > o.txt", check=True)
        orch.wait("j", {"done_marker_verified"}, timeout=60)
        second = os.stat(prom)
        assert second.st_ino != first.st_ino  # a new file took the name: os.replace, not a rewrite
        held.seek(0)
        assert held.read() == old_text
        assert 'orch_jobs{state="done_marker_verified"} 0' in old_text
        assert 'orch_jobs{state="done_marker_verified"} 1' in prom.read_text()
    finally:
        held.close()
    assert sorted(p.name for p in textfile_dir.iterdir()) == ["orch.prom"]  # no tmp file left behind


def test_metrics_without_textfile_prints_the_same_exposition(orch, tmp_path):
    orch("submit", "--name", "j", "--", "true", check=True)
    orch.wait("j", {"retryable_failed"}, timeout=60)
    p = orch("metrics", check=True)
    assert p.stderr == ""
    out = tmp_path / "out"
    out.mkdir()
    orch("metrics", "--textfile", out, check=True)
    assert p.stdout == (out / "orch.prom").read_text()
    fams = {f.name: f for f in text_string_to_metric_families(p.stdout)}
    assert fams["orch_jobs"].type == "gauge" and fams["orch_reconcile_passes"].type == "counter"


def test_a_textfile_dir_that_is_missing_is_a_usage_error_and_writes_nothing(orch, tmp_path):
    p = orch("metrics", "--textfile", tmp_path / "nope")
    assert p.returncode == 2
    assert "Directory" in p.stderr and "does not exist" in p.stderr
    assert not (tmp_path / "nope").exists()


def test_a_relative_textfile_dir_in_orch_toml_is_refused_naming_the_key(orch):
    orch.write_config('[metrics]\ntextfile_dir = "prom"\n')
    p = orch("status")
    assert p.returncode == 2
    assert p.stderr.strip() == (f"orch: {orch.home / 'orch.toml'}: metrics.textfile_dir must be an absolute path, "
                                "got 'prom'")


def test_a_reconcile_pass_whose_textfile_dir_vanished_warns_and_still_works(orch, tmp_path):
    orch.write_config(f'[metrics]\ntextfile_dir = "{tmp_path / "gone"}"\n')
    orch("submit", "--name", "j", "--outputs", "o.txt", "--", "sh", "-c", "echo x > o.txt", check=True)
    p = orch("reconcile")
    assert p.returncode == 0
    assert f"warning: metrics: cannot write {tmp_path / 'gone' / 'orch.prom'}" in p.stderr
    orch.wait("j", {"done_marker_verified"}, timeout=60)


def test_env_override_of_the_textfile_dir(orch, tmp_path):
    d = tmp_path / "from-env"
    d.mkdir()
    orch("reconcile", env={"ORCH_METRICS_TEXTFILE_DIR": str(d)}, check=True)
    assert (d / "orch.prom").exists()


FAKE_TOOL = """#!/bin/sh
# a stand-in for {tool}: fails while $FAKE/fail exists, else prints $FAKE/{tool}.out
if [ -e "$FAKE/fail" ]; then echo "{tool}: error: Unable to contact slurm controller" >&2; exit 1; fi
cat "$FAKE/{tool}.out" 2>/dev/null; exit 0
"""


def test_scheduler_query_failures_of_the_last_pass_and_in_total(orch, tmp_path):
    """sacct/squeue faked at the process boundary (real processes on PATH that fail, as an unreachable
    slurmctld makes them): the failed queries are counted, and the attempt keeps its state."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    for tool in ("sbatch", "sacct", "squeue"):
        (fake / tool).write_text(FAKE_TOOL.format(tool=tool))
        (fake / tool).chmod(0o755)
    (fake / "sbatch.out").write_text("4242\n")
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "FAKE": str(fake)}
    orch("submit", "--backend", "slurm", "--name", "s", "--", "true", env=env, check=True)
    (token,), = db_rows(orch.home, "SELECT token FROM attempts")
    (fake / "fail").touch()
    orch("reconcile", env=env, check=True)
    orch("reconcile", env=env, check=True)
    m = scrape_stdout(orch("metrics", check=True).stdout)
    assert value(m, "orch_reconcile_last_pass_scheduler_query_failures") == 1  # sacct (squeue is not asked)
    assert value(m, "orch_scheduler_query_failures", "orch_scheduler_query_failures_total") == 2
    assert orch.state("s") == "submitted"
    (fake / "fail").unlink()
    (fake / "sacct.out").write_text(f"4242|orch-{token}|RUNNING|0:0|1|None\n")
    orch("reconcile", env=env, check=True)
    m = scrape_stdout(orch("metrics", check=True).stdout)
    assert value(m, "orch_reconcile_last_pass_scheduler_query_failures") == 0
    assert value(m, "orch_scheduler_query_failures", "orch_scheduler_query_failures_total") == 2
    assert orch.state("s") == "running"


def test_steps_redone_after_a_real_trainer_preemption(orch):
    """The bundled trainer, SIGTERMed mid-run (os.kill, as a scheduler's preemption), resumes as attempt
    2: the metric equals the first attempt's last reported step minus the step run_config.json says
    attempt 2 resumed from (the trainer's own record, which the metric does not read)."""
    orch("submit", "--name", "tr", "--", sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--max-steps", "400",
         "--save-interval", "50", "--heartbeat-interval", "0.1", check=True)
    run = orch.runs / "tr"
    wait_for(lambda: (protocol.read_progress(run, 1) or {}).get("step", 0) >= 60, 120, "the trainer's step 60",
             interval=0.2)
    os.kill(wrapper_record(run)["child_pid"], signal.SIGTERM)
    assert orch.wait("tr", {"done_marker_verified"}, timeout=300) == "done_marker_verified"
    a1 = orch.show("tr")["attempts"][0]
    assert a1["failure_class"] == "preempted"
    reached = max(a1["failure_step"], protocol.read_progress(run, 1)["step"])
    resumed = json.loads((run / "run_config.json").read_text())["resumed_from_step"]
    assert json.loads((run / "run_config.json").read_text())["attempt"] == 2 and resumed > 0
    m = scrape_stdout(orch("metrics", check=True).stdout)
    assert value(m, "orch_preemption_steps_redone", "orch_preemption_steps_redone_count") == 1
    assert value(m, "orch_preemption_steps_redone", "orch_preemption_steps_redone_sum") == reached - resumed
    assert value(m, "orch_preemptions_unmeasured") == 0
