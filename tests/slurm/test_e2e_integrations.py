"""Bring your own trainer on the real dev Slurm cluster: a real partition preemption of a Lightning job
(spot: Slurm requeues it in place) and of a Hugging Face job (spot-cancel: orch requeues it), both
through the real CLI with the examples as users would write them.

Claims: each job is stopped by the preemption's SIGTERM, checkpoints the step it completed, resumes
from exactly that step (0 optimizer steps redone, measured with the examples' step logs) and ends
``done_marker_verified``.
"""

from __future__ import annotations

import collections
import json
import sys
import time
from pathlib import Path

import pytest
from slurmkit import cancel_all_of, node_idle, run

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


def submit(orch, name: str, partition: str, script: str, log: Path) -> None:
    p = orch("submit", "--backend", "slurm", "--name", name, "--partition", partition, "--cpus-per-task", "1",
             "--mem", "3G", "--", sys.executable, str(ROOT / "examples" / script), "--max-steps", str(STEPS),
             "--sleep-per-step", "0.08", "--step-log", str(log))
    assert p.returncode == 0, p.stdout + p.stderr


def drive(orch, names: list[str], until, timeout: float, log: list) -> dict[str, dict]:
    t0 = time.time()
    while True:
        orch("reconcile", check=True)
        rows = {r["name"]: r for r in orch.json("status")}
        log.append((round(time.time() - t0, 1), {n: (rows[n]["state"], rows[n]["attempts"], rows[n]["restarts"])
                                                 for n in names}))
        if until(rows):
            return rows
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s:\n" + "\n".join(map(str, log[-30:])) + "\n" +
                                 "\n".join(json.dumps(orch.show(n)) for n in names))
        time.sleep(1)


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
