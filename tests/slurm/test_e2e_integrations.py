"""Bring your own trainer on the real dev Slurm cluster: a real partition preemption of a Lightning job
(spot: Slurm requeues it in place) and of a Hugging Face job (spot-cancel: orch requeues it), both
through the real CLI with the examples as users would write them.

Claims: each job is stopped by the preemption's SIGTERM, checkpoints the step it completed, resumes
from exactly that step (0 optimizer steps redone, measured with the examples' step logs) and ends
``done_marker_verified``, with W&B logging offline: Slurm's SIGTERM ends W&B's service process too, and the
tracker's failures that follow cost no checkpoint (HF redid every step).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path

import pytest
from orchkit import wait_for
from slurmkit import cancel_all_of, node_idle, run, start_requeued

from orchestrator import protocol

ROOT = Path(__file__).resolve().parents[2]
DONE = "done_marker_verified"
BAD = {"failed", "cancelled"}
STEPS = 400


@pytest.fixture
def jobs(orch):
    """The orch env the jobs inherit (sbatch --export=ALL), and every Slurm job cancelled at the end."""
    orch.env.update(ORCH_HEARTBEAT_S="0.5", WANDB_MODE="offline", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    extra: list[str] = []
    yield extra
    cancel_all_of(orch, extra)


def submit(orch, name: str, partition: str, script: str, log: Path, steps: int = STEPS, *opts: str) -> None:
    p = orch("submit", "--backend", "slurm", "--name", name, "--partition", partition, "--cpus-per-task", "1",
             "--mem", "3G", *opts, "--", sys.executable, str(ROOT / "examples" / script), "--max-steps", str(steps),
             "--sleep-per-step", "0.08", "--step-log", str(log), "--wandb")  # W&B's service is signalled too
    assert p.returncode == 0, p.stdout + p.stderr


def drive(orch, names: list[str], until, timeout: float, log: list) -> dict[str, dict]:
    t0 = time.monotonic()

    def passed() -> dict[str, dict] | None:
        orch("reconcile", check=True)
        rows = {r["name"]: r for r in orch.json("status")}
        log.append((round(time.monotonic() - t0, 1), {n: (rows[n]["state"], rows[n]["attempts"], rows[n]["restarts"])
                                                      for n in names}))
        return rows if until(rows) else None

    return wait_for(passed, timeout, f"{names} to reach the states asked for", interval=1,
                    detail=lambda: "\n" + "\n".join(map(str, log[-30:])) + "\n" +
                    "\n".join(json.dumps(orch.show(n)) for n in names))


def steps_of(log: Path) -> list[tuple[int, int]]:
    return [(int(a), int(s)) for a, s in (ln.split() for ln in log.read_text().splitlines() if ln.strip())]


def test_e2e_lightning_on_spot_and_hf_on_spot_cancel_survive_a_real_preemption(orch, jobs, tmp_path):
    node_idle()
    logs = {"lit": tmp_path / "lit.log", "hf": tmp_path / "hf.log"}
    submit(orch, "lit", "spot", "lightning_train.py", logs["lit"])
    submit(orch, "hf", "spot-cancel", "hf_train.py", logs["hf"])
    lit, hf = orch.runs / "lit", orch.runs / "hf"

    def step(run_dir: Path) -> int:
        return int((protocol.read_progress(run_dir, 1) or {}).get("step") or 0)

    history: list = []
    drive(orch, ["lit", "hf"], lambda r: step(lit) >= 20 and step(hf) >= 20, timeout=240, log=history)
    p = run("sbatch", "--parsable", "-p", "prio", "-c", "2", "--mem=200M", "-o", "/dev/null", "--wrap", "sleep 2")
    assert p.returncode == 0, p.stderr
    jobs.append(p.stdout.strip())
    rows = drive(orch, ["lit", "hf"], lambda r: all(x["state"] in {DONE} | BAD for x in r.values()),
                 timeout=600, log=history)
    assert {n: r["state"] for n, r in rows.items()} == {"lit": DONE, "hf": DONE}, history

    # Lightning on spot: requeued in place by Slurm (one orch attempt, restarts=1); the first run's
    # report was kept aside by the rerun.
    show = orch.show("lit")
    assert len(show["attempts"]) == 1 and show["attempts"][0]["restarts"] == 1, show
    first = json.loads((protocol.attempt_dir(lit, 1) / "failure.prev-1.json").read_text())
    assert first["class"] == "preempted" and 0 < first["step"] < STEPS, first
    assert show["attempts"][0]["restart_history"] == [{"restart": 1, "class": "preempted", "step": first["step"]}]
    text = orch("show", "lit", check=True).stdout
    assert f"restarts=1 (preempted at step {first['step']})" in text and f"last step: {STEPS}" in text, text
    # HF on spot-cancel: Slurm ended the job; orch classified it preempted and requeued it (attempt 2).
    show = orch.show("hf")
    assert [a["failure_class"] for a in show["attempts"]] == ["preempted", None], show
    assert show["attempts"][0]["action"]["auto"] is True, show
    report = protocol.read_failure(hf, 1)

    for name, stopped_at in (("lit", first["step"]), ("hf", report["step"])):
        steps = steps_of(logs[name])
        counts = collections.Counter(s for _, s in steps)
        assert sorted(counts) == list(range(1, STEPS + 1)) and max(counts.values()) == 1, (name, counts.most_common(3))
        runs = [s for _, s in steps]
        resumed_at = runs.index(stopped_at) + 1
        assert runs[resumed_at] == stopped_at + 1, (name, stopped_at)  # the rerun began right after it
        v = orch("verify", name)
        assert (v.returncode, v.stdout) == (0, "VERIFIED\n")
    print(f"\n[measured] lit stopped at step {first['step']} ({first['detail']}), hf at {report['step']}; "
          f"0 steps redone; verified {history[-1][0]:.0f} s after the start of driving")


TIME_LIMIT_STEPS = 500  # 2 or 3 attempts of --time 1: the warning comes 10 to 40 s before the limit


def test_lightning_hf_and_the_plain_loop_with_wandb_under_a_real_time_limit_redo_no_step(orch, jobs, tmp_path):
    """Under a time limit, every attempt of a Lightning or HF job with W&B redid every step since its last
    save (the limit's SIGTERM ended W&B's service first, and the next wandb.log failed before the stop's save), and
    the job ended failed (no_progress). orch's warning reaches the program alone, before the limit: each attempt
    saves at it, the next resumes right after, every step is computed once, in one W&B run. The node has 2 CPUs:
    the third job starts when one of the first two ends."""
    node_idle()
    names = {"tl-lit": "lightning_train.py", "tl-hf": "hf_train.py", "tl-loop": "plain_loop.py"}
    for name, script in names.items():
        submit(orch, name, "spot", script, tmp_path / f"{name}.log", TIME_LIMIT_STEPS, "--time", "1")
    history: list = []
    rows = drive(orch, list(names), lambda r: all(r[n]["state"] in {DONE} | BAD for n in names), timeout=600,
                 log=history)
    assert {n: r["state"] for n, r in rows.items() if n in names} == dict.fromkeys(names, DONE), history
    for name in names:
        shown = orch.show(name)["attempts"]
        assert len(shown) >= 2, (name, shown)
        assert all(a["failure_class"] in {"timeout", "preempted"} and not a["counted"] for a in shown[:-1]), shown
        steps = steps_of(tmp_path / f"{name}.log")
        counts = collections.Counter(s for _, s in steps)
        assert sorted(counts) == list(range(1, TIME_LIMIT_STEPS + 1)) and max(counts.values()) == 1, \
            (name, counts.most_common(3))
        run_id = protocol.stable_run_id(orch.runs / name, name)
        runs = sorted((orch.runs / name / "wandb").glob("offline-run-*"))
        # each attempt that trained a step logged to W&B, all into one run; one warned while it still started up
        # (Lightning's imports under a loaded CI: 6 attempts, one with no step) may end before W&B starts
        trained = {a for a, _ in steps}
        assert len(trained) <= len(runs) <= len(shown) and all(p.name.endswith(f"-{run_id}") for p in runs), \
            (name, runs, sorted(trained))
        print(f"\n[measured] {name}: {len(shown)} attempts under --time 1, 0 steps redone")
    print(f"[measured] all verified {history[-1][0]:.0f} s after the start of driving")


LONG_STEPS = 1500  # 2 min of steps: a prio job takes ~20 s (grace included) to preempt, twice, with room


def _preemptions(orch, name: str) -> int:
    """How often the job was stopped by a preemption: in place (Slurm's restarts) or by orch (new attempts)."""
    att = orch.show(name)["attempts"]
    return sum(a["restarts"] for a in att) + sum(a["failure_class"] == "preempted" for a in att)


def _running_in_slurm(orch, name: str) -> bool:
    att = orch.show(name)["attempts"]
    ext = att[-1]["external_id"] if att else None
    return bool(ext) and run("squeue", "-h", "-j", ext, "-o", "%t").stdout.strip() == "R"


def _preempted_n_times_redoes_no_step(orch, jobs, tmp_path, script: str, partition: str, steps: int,
                                      preemptions: int) -> None:
    """The core claim on the cluster: preempted ``preemptions`` times by real prio jobs, the job ends
    done_marker_verified with every step computed exactly once (0 redone). One job at a time, so each prio
    job preempts exactly it."""
    node_idle()
    name, log = script.split("_")[0], tmp_path / "steps.log"
    submit(orch, name, partition, script, log, steps=steps)
    t0, seen_at = time.time(), 0  # log lines seen when the last preemption was sent
    deadline = time.monotonic() + 600  # for all the preemptions together

    def reconcile_pass() -> None:
        orch("reconcile", check=True)
        start_requeued(lambda _jid, name: name.startswith("orch-"))

    def recorded(before: int) -> bool:  # this preemption is on record
        if _preemptions(orch, name) != before:
            return True
        assert orch.state(name) != DONE, f"finished before preemption {before + 1}: {orch.show(name)}"
        reconcile_pass()
        return False

    def all_preempted() -> bool:
        nonlocal seen_at
        if _preemptions(orch, name) >= preemptions:
            return True
        reconcile_pass()
        lines = len(steps_of(log)) if log.exists() else 0
        if lines >= seen_at + 20 and _running_in_slurm(orch, name):
            before = _preemptions(orch, name)
            p = run("sbatch", "--parsable", "-p", "prio", "-c", "2", "--mem=200M", "-o", "/dev/null", "--wrap",
                    "sleep 2")
            assert p.returncode == 0, p.stderr
            jobs.append(p.stdout.strip())
            wait_for(lambda: recorded(before), max(0.0, deadline - time.monotonic()), f"preemption {before + 1}",
                     interval=1, detail=lambda: (orch.show(name), run("squeue").stdout))
            seen_at = len(steps_of(log))
        return False

    wait_for(all_preempted, 600, f"{preemptions} preemption(s) of {name}", interval=1,
             detail=lambda: (orch.show(name), run("squeue").stdout))
    history: list = []
    rows = drive(orch, [name], lambda r: r[name]["state"] in {DONE} | BAD, timeout=600, log=history)
    assert rows[name]["state"] == DONE, orch.show(name)
    assert _preemptions(orch, name) == preemptions, orch.show(name)
    counts = collections.Counter(s for _, s in steps_of(log))
    assert sorted(counts) == list(range(1, steps + 1)), counts.most_common(3)
    redone = sum(c - 1 for c in counts.values())
    print(f"\n[measured] {name} on {partition}: {preemptions} real preemption(s), {redone} optimizer steps redone, "
          f"verified {time.time() - t0:.0f} s after submission")
    assert redone == 0, counts.most_common(3)
    v = orch("verify", name)
    assert (v.returncode, v.stdout) == (0, "VERIFIED\n")


@pytest.mark.skipif(os.environ.get("ORCH_LONG") != "1", reason="long variant (~9 min): set ORCH_LONG=1")
@pytest.mark.parametrize("script, partition", [("plain_loop.py", "spot-cancel"), ("lightning_train.py", "spot"),
                                               ("hf_train.py", "spot-cancel")], ids=["plain", "lightning", "hf"])
def test_each_integration_preempted_twice_by_real_prio_jobs_redoes_no_step(orch, jobs, tmp_path, script, partition):
    _preempted_n_times_redoes_no_step(orch, jobs, tmp_path, script, partition, LONG_STEPS, 2)
