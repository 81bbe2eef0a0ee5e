"""A Slurm sweep's --throttle K reaches sbatch as ``--array=...%K`` and Slurm then runs at most K tasks at once
(removing the ``%K`` from the array's argv passed the whole suite). The node has 2 CPUs and each task
asks for 1, so without the throttle two tasks would overlap."""

from __future__ import annotations

import json
import sys
import textwrap

from orchkit import wait_for
from slurmkit import node_idle, run

TASK = textwrap.dedent('''
    import json, os, time
    log = os.environ["THROTTLE_LOG"]
    with open(log, "a") as f:
        f.write(json.dumps({"task": os.environ["ORCH_TASK_INDEX"], "event": "start", "t": time.time()}) + "\\n")
    time.sleep(4)
    with open("result.txt", "w") as f:
        f.write("ok\\n")
    with open(log, "a") as f:
        f.write(json.dumps({"task": os.environ["ORCH_TASK_INDEX"], "event": "end", "t": time.time()}) + "\\n")
''')


def test_array_throttle_reaches_sbatch_and_slurm_runs_at_most_k_tasks_at_once(orch, tmp_path):
    node_idle()
    script, log = tmp_path / "task.py", tmp_path / "throttle.log"
    script.write_text(TASK)
    p = orch("sweep", "--name", "thr", "--backend", "slurm", "--partition", "prio", "--cpus-per-task", "1",
             "--mem", "100M", "--grid", "i=0,1,2", "--throttle", "1", "--outputs", "result.txt", "--",
             sys.executable, str(script), env={"THROTTLE_LOG": str(log)})
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [r for r in orch.json("status", "--tasks") if r["name"].startswith("thr.")]
    (array,) = {r["external_id"].split("_")[0] for r in rows}
    try:
        shown = run("scontrol", "show", "job", array).stdout
        assert "ArrayTaskThrottle=1" in shown, shown  # the %1 reached sbatch

        def verified() -> bool:
            orch("reconcile", check=True)
            rows = [r for r in orch.json("status", "--tasks") if r["name"].startswith("thr.")]
            return all(r["state"] == "done_marker_verified" for r in rows)

        wait_for(verified, 300, "every task verified", interval=1, detail=lambda: orch.json("status", "--tasks"))
    finally:
        run("scancel", array)
    spans: dict[str, dict[str, float]] = {}
    for line in log.read_text().splitlines():
        e = json.loads(line)
        spans.setdefault(e["task"], {})[e["event"]] = e["t"]
    assert len(spans) == 3 and all(set(s) == {"start", "end"} for s in spans.values()), spans
    ordered = sorted(spans.values(), key=lambda s: s["start"])
    # Each task started after the one before it ended: never two at once (the order of events, not a duration).
    assert all(b["start"] >= a["end"] for a, b in zip(ordered, ordered[1:], strict=False)), ordered
