"""Every command the README shows, run as a new user types it (issue 41: the README's own multi-rank command was
`invalid` at once, and `orch submit -- python train.py` could not open train.py: the job runs in its run dir).

The README's ```bash blocks are read. Each ``orch ...`` line (continuations joined, its comment cut; a line with
``[optional]`` parts once without them and once with all of them) must be a command this module knows:

* ``LOCAL``: run here by ``bash -c``, as written, in a directory holding the user's ``train.py``, ``prepare.sh`` and
  ``runs.jsonl``, with ``orch`` and ``python`` on PATH; the exit code it must give (the README's own where it
  says one). ``PLACEHOLDERS`` names what stands for a value (``DIR``) and what it becomes here;
* ``SLURM``: the commands that name ``--backend slurm`` (the Slurm tier's to run; listed here so that they are
  known);
* ``NOT_RUN``: lines that are not commands (``orch submit --wait ...``), each with why.

A command the README gains, or one it changes, fails ``test_every_readme_command_is_known`` until it is run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from orchkit import ROOT, wait_for

README = ROOT / "README.md"
QUICK_START = ("bash scripts/setup.sh && .venv/bin/orch submit --name demo --wait -- .venv/bin/python -m orch_trainer "
               "--preset tiny")
DONE = "done_marker_verified"

# The commands run by the local test, README text -> the exit code it must give.
LOCAL: dict[str, int] = {
    "orch submit --name prep --outputs 'out/*.parquet' -- ./prepare.sh": 0,
    "orch submit --name hf --outputs 'out/*' --keep 'state/*.pt' -- python train.py": 0,
    "orch submit --name ddp --nproc-per-node 2 -- python train.py": 0,
    "orch sweep --name lr --grid lr=1e-3,3e-4 --grid seed=0,1 -- python train.py --lr {lr} --seed {seed}": 0,
    "orch sweep --name ablate --from runs.jsonl -- python train.py --config {cfg}": 0,
    "orch submit --spot-notice aws -- python train.py": 0,
    "orch status": 0,
    "orch status --state retryable_failed --tasks --json": 0,
    "orch status --tasks": 0,
    "orch metrics": 0,
    "orch metrics --textfile DIR": 0,
    "orch report": 0,
    "orch report --since 7d --json": 0,
    "orch nodes": 0,
    "orch nodes --json": 0,
    "orch nodes --clear gpu07": 2,  # the README: "a name that is not an excluded node: exit 2"
    "orch show lm1": 0,
    "orch show lm1 --json": 0,
    "orch show lm1 --events": 0,
    "orch show lm1 --events --json": 0,
    "orch verify lm1": 0,
    "orch reconcile": 0,
    "orch reconcile --watch 30": 130,  # a loop: interrupted (Ctrl-C) once it ran a pass
    "orch requeue --failed": 0,
    "orch requeue --failed --dry-run --json": 0,
    "orch requeue lm1 lm2": 3,  # the README: "exit 3 for a verified job" (both are)
    "orch requeue lm1 lm2 --dry-run": 3,
    "orch logs lm1": 0,
    "orch logs lm1 --attempt 2 -f": 0,  # lm1 was preempted once: attempt 2 ended, -f returns
    "orch watch lm1": 0,
    "orch watch lm1 > lm1.log": 0,
    "orch plot lm1 -o lm1.png": 0,
    "orch plot lm1 -o lm1.png --size 1000x500": 0,
    "orch plot lm1 --json": 0,
    "orch gc": 0,
    "orch cancel lm1": 3,  # lm1 is verified: "not cancelled: job is done_marker_verified"
    "orch cancel lr": 0,  # a sweep: its tasks, all done, none to cancel
}
PLACEHOLDERS = {"DIR": "textfile"}  # `orch metrics --textfile DIR`: a directory of the user's
SLURM = {
    "orch submit --name lm1 --backend slurm --partition spot --gpus 1 --cpus-per-task 8 --mem 32G "
    "--time 1-00:00:00 --max-attempts 3 -- .venv/bin/python -m orch_trainer --preset tiny --max-steps 2000",
    "orch submit --name big --backend slurm --nodes 4 --nproc-per-node 8 --gpus-per-node 8 -- python train.py",
    "orch sweep --name lr --grid lr=1e-3,3e-4,1e-4 --grid seed=0,1,2 --throttle 4 --backend slurm "
    "--partition spot --gpus 1 -- python train.py --lr {lr} --seed {seed}",
}
NOT_RUN = {
    "orch submit --wait ...": "'...' stands for any submit; --wait is run by the quick start",
}

# The user's own script: orch's plain-loop integration around a tiny model; any option the README passes it
# (--lr, --seed, --config) is read and ignored. It writes out/ (the hf job's --outputs) and state/ (its --keep).
TRAIN_PY = '''
import argparse, os
import torch
from torch import nn
from orchestrator.integrations.loop import orch_run

ap = argparse.ArgumentParser()
ap.add_argument("--max-steps", type=int, default=6)
ap.add_argument("--sleep-per-step", type=float, default=0.0)
a, _ = ap.parse_known_args()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    torch.distributed.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with orch_run(model, opt, save_every=2) as run:
    for step in run.steps(a.max_steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        run.log(loss=loss.item())
        if a.sleep_per_step:
            import time; time.sleep(a.sleep_per_step)
os.makedirs("out", exist_ok=True)
os.makedirs("state", exist_ok=True)
open("out/summary.txt", "w").write("trained\\n")
torch.save(model.state_dict(), "state/model.pt")
'''
PREPARE_SH = "#!/bin/sh\nmkdir -p out && echo data > out/part-0.parquet\n"


def readme_commands() -> set[str]:
    """Every ``orch`` command line of the README's bash blocks (and the quick start), normalised as LOCAL's keys."""
    out: set[str] = set()
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if not (line.startswith("orch ") or line.startswith("bash scripts/setup.sh")):
                continue
            cmd = re.sub(r"\s+#.*$", "", line).strip()
            cmd = re.sub(r"\s+", " ", cmd)
            if "[" not in cmd:
                out.add(cmd)
                continue
            out.add(re.sub(r"\s*\[[^]]*\]", "", cmd))  # without every optional part
            out.add(re.sub(r"\s*\[([^]]*)\]", r" \1", cmd).replace("  ", " "))  # with all of them
    return out


def test_every_readme_command_is_known():
    """Each README command is run here (or in the Slurm tier), or is listed as not a command, with why."""
    known = set(LOCAL) | SLURM | set(NOT_RUN) | {QUICK_START}
    got = readme_commands()
    assert got - known == set(), f"README commands no test runs: {sorted(got - known)}"
    assert known - got == set(), f"commands the README no longer shows: {sorted(known - got)}"


def _user_dir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A new user's directory (their script, data prep, sweep spec) and environment (orch and python on PATH)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(textwrap.dedent(TRAIN_PY))
    (work / "prepare.sh").write_text(PREPARE_SH)
    (work / "prepare.sh").chmod(0o755)
    (work / "runs.jsonl").write_text('{"cfg": "a.yaml"}\n{"cfg": "b.yaml"}\n')
    (work / PLACEHOLDERS["DIR"]).mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "orch").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m orchestrator.cli "$@"\n')
    (bin_dir / "orch").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    # python: this venv's own (a symlink to it elsewhere would not find the venv's packages)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(ORCH_HOME=str(tmp_path / "home"), PATH=path,
               PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", ORCH_HEARTBEAT_S="0.2")
    return work, env


def _run(cmd: str, work: Path, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    for word, value in PLACEHOLDERS.items():
        cmd = re.sub(rf"\b{word}\b", value, cmd)
    return subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)


def _status(work: Path, env: dict[str, str]) -> dict[str, str]:
    p = _run("orch status --tasks --json", work, env)
    assert p.returncode == 0, p.stderr
    return {j["name"]: j["state"] for j in json.loads(p.stdout)}


def _all_verified(work: Path, env: dict[str, str]) -> dict[str, str] | None:
    assert _run("orch reconcile", work, env).returncode == 0
    states = _status(work, env)
    return states if states and all(s in (DONE, "failed", "cancelled") for s in states.values()) else None


def test_the_quick_start_runs_as_written_in_a_fresh_checkout(tmp_path):
    """The README's first command, after its set-up (the set-up is what CI runs on a clean clone): from the
    checkout's root, with relative paths to its venv."""
    _work, env = _user_dir(tmp_path)
    run = QUICK_START.split(" && ", 1)[1]
    p = subprocess.run(["bash", "-c", run], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "submitted demo" in p.stdout


def test_every_local_readme_command_runs_as_written(tmp_path):
    work, env = _user_dir(tmp_path)
    # lm1 and lm2, the jobs the README's reference lines name (lm1 is a Slurm job there; here a local one that was
    # preempted once, so that it has the attempt 2 `orch logs lm1 --attempt 2` reads).
    for name, args in (("lm1", "--max-steps 40 --sleep-per-step 0.1"), ("lm2", "")):
        assert _run(f"orch submit --name {name} -- python train.py {args}", work, env).returncode == 0
    lm1 = Path(env["ORCH_HOME"]) / "runs" / "lm1"
    ended = lm1 / "attempts" / "1" / "exit.json"

    def first_checkpoint() -> bool:
        assert not ended.exists(), _run("orch reconcile; orch show lm1; orch logs lm1", work, env).stdout[-3000:]
        return (lm1 / "checkpoints").is_dir() and any((lm1 / "checkpoints").glob("step-*"))

    wait_for(first_checkpoint, 120, "lm1's first checkpoint")
    wrapper = json.loads((lm1 / "attempts" / "1" / "wrapper.json").read_text())
    os.kill(wrapper["child_pid"], signal.SIGTERM)  # a preemption, as the program sees one

    results: dict[str, subprocess.CompletedProcess] = {}
    submits = [c for c in LOCAL if c.startswith(("orch submit", "orch sweep"))]
    for cmd in submits:
        results[cmd] = _run(cmd, work, env)
    states = wait_for(lambda: _all_verified(work, env), 300, "every job to end", interval=1,
                      detail=lambda: _status(work, env))
    assert set(states.values()) == {DONE}, states
    attempts = json.loads(_run("orch show lm1 --json", work, env).stdout)["attempts"]
    assert [a["failure_class"] for a in attempts] == ["preempted", None], attempts

    # `orch reconcile --watch 30`: its first pass ends a job whose program already exited; then Ctrl-C.
    assert _run("orch submit --name w -- python train.py --max-steps 2", work, env).returncode == 0
    exit_json = Path(env["ORCH_HOME"]) / "runs" / "w" / "attempts" / "1" / "exit.json"
    wait_for(exit_json.exists, 120, "job w's program to exit")
    watch = subprocess.Popen(["bash", "-c", "exec orch reconcile --watch 30"], cwd=work, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _status(work, env).get("w") == DONE, 120, "the watch loop's first pass to end job w")
    finally:
        watch.send_signal(signal.SIGINT)
    out, err = watch.communicate(timeout=60)
    assert "w: -> done_marker_verified" in out, out + err
    results["orch reconcile --watch 30"] = subprocess.CompletedProcess([], watch.returncode, out, err)
    for cmd in LOCAL:
        if cmd not in results:
            results[cmd] = _run(cmd, work, env)

    wrong = {c: (r.returncode, (r.stderr or r.stdout)[-300:]) for c, r in results.items() if r.returncode != LOCAL[c]}
    assert not wrong, wrong
    tracebacks = [c for c, r in results.items() if "Traceback" in (r.stderr or "")]
    assert not tracebacks, tracebacks
    assert (work / "lm1.png").stat().st_size > 0 and (work / "lm1.log").read_text()
    assert (work / PLACEHOLDERS["DIR"] / "orch.prom").read_text().startswith("#")
