"""Every command the README and the docs show, run as a new user types it (the README's own multi-rank command was
`invalid` at once, and `orch submit -- python train.py` could not open train.py: the job runs in its run dir).

The ```bash blocks of the README and of every page under docs/ are read. Each ``orch ...`` line (continuations
joined, its comment cut; a line with ``[optional]`` parts once without them and once with all of them) must be a
command this module knows:

* ``LOCAL``: run here by ``bash -c``, as written, in a directory holding the user's ``train.py``, ``prepare.sh`` and
  ``runs.jsonl``, with ``orch`` and ``python`` on PATH; the exit code it must give (the README's own where it
  says one). ``PLACEHOLDERS`` names what stands for a value (``DIR``) and what it becomes here;
* ``SLURM``: the commands that name ``--backend slurm``, run in tests/slurm/test_readme_commands_slurm.py
  (its ``AS_RUN_HERE`` must hold each);
* ``NOT_RUN``: lines that are not commands (``orch submit --wait ...``), each with why.

A command the README gains, or one it changes, fails ``test_every_readme_command_is_known`` until it is run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from orchkit import ROOT, wait_for
from readmekit import DONE, EXAMPLES, PLACEHOLDERS, QUICK_START, all_ended, readme_commands, run_cmd, status, user_dir

# The commands run by the local test, README text -> the exit code it must give.
LOCAL: dict[str, int] = {
    "orch submit --name prep --outputs 'out/*.parquet' -- ./prepare.sh": 0,
    "orch submit --name hf --outputs 'out/*' --keep 'state/*.pt' -- python train.py": 0,
    "orch submit --name ddp --nproc-per-node 2 -- python train.py": 0,
    "orch sweep --name lr --grid lr=1e-3,3e-4 --grid seed=0,1 -- python train.py --lr {lr} --seed {seed}": 0,
    "orch sweep --name ablate --from runs.jsonl -- python train.py --config {cfg}": 0,
    "orch submit --spot-notice aws -- python train.py": 0,
    "orch status": 0,
    "orch status --state retryable_failed --since 24h --tasks --json": 0,
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
    "orch watch lr": 0,  # a sweep whose tasks all verified
    # the README's tour: a job preempted at step 20 (the trainer's own SIGTERM), requeued and verified
    "orch submit --name tour -- python -m orch_trainer --preset tiny --inject-fault sigterm@step=20": 0,
    "orch watch tour": 0,
    "orch show tour": 0,
    "orch verify tour": 0,
}
SLURM = {
    "orch submit --name lm1 --backend slurm --partition spot --gpus 1 --cpus-per-task 8 --mem 32G "
    "--time 1-00:00:00 --max-attempts 3 -- .venv/bin/python -m orch_trainer --preset tiny --max-steps 2000",
    "orch submit --name big --backend slurm --nodes 4 --nproc-per-node 8 --gpus-per-node 8 -- python train.py",
    "orch sweep --name lr --grid lr=1e-3,3e-4,1e-4 --grid seed=0,1,2 --throttle 4 --backend slurm "
    "--partition spot --gpus 1 -- python train.py --lr {lr} --seed {seed}",
}
NOT_RUN = {
    "orch submit --wait ...": "'...' stands for any submit; --wait is run by the quick start",
    "bash scripts/setup.sh --dev && .venv/bin/mkdocs serve": "a server until Ctrl-C; the strict build of the site it "
    "serves is tests/unit/test_docs.py's",
    "orch dashboard": "a server until Ctrl-C: tests/browser/test_dashboard_browser.py runs it (--port 0, its printed "
    "URL opened in Chromium)",
    "orch dashboard --host H --port 8080 --token-file F": "a server until Ctrl-C: tests/browser runs it with --host "
    "0.0.0.0 --token-file (a request without the token: 401); its exit-2 refusals are tests/unit/test_dashboard.py's",
}



def test_every_readme_command_is_known():
    """Each README command is run here (or in the Slurm tier; the guides' examples in tests/docs), or is listed as
    not a command, with why."""
    known = set(LOCAL) | SLURM | set(NOT_RUN) | set(EXAMPLES) | {QUICK_START}
    got = readme_commands()
    assert got - known == set(), f"README commands no test runs: {sorted(got - known)}"
    assert known - got == set(), f"commands the README no longer shows: {sorted(known - got)}"


def test_the_quick_start_runs_as_written_in_a_fresh_checkout(tmp_path):
    """The README's first command, after its set-up (the set-up is what CI runs on a clean clone): from the
    checkout's root, with relative paths to its venv."""
    _work, env = user_dir(tmp_path)
    run = QUICK_START.split(" && ", 1)[1]
    p = subprocess.run(["bash", "-c", run], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "submitted demo" in p.stdout


def test_every_local_readme_command_runs_as_written(tmp_path):
    work, env = user_dir(tmp_path)
    # lm1 and lm2, the jobs the README's reference lines name (lm1 is a Slurm job there; here a local one that was
    # preempted once, so that it has the attempt 2 `orch logs lm1 --attempt 2` reads).
    for name, args in (("lm1", "--max-steps 40 --sleep-per-step 0.1"), ("lm2", "")):
        assert run_cmd(f"orch submit --name {name} -- python train.py {args}", work, env).returncode == 0
    lm1 = Path(env["ORCH_HOME"]) / "runs" / "lm1"
    ended = lm1 / "attempts" / "1" / "exit.json"

    def first_checkpoint() -> bool:
        assert not ended.exists(), run_cmd("orch reconcile; orch show lm1; orch logs lm1", work, env).stdout[-3000:]
        return (lm1 / "checkpoints").is_dir() and any((lm1 / "checkpoints").glob("step-*"))

    wait_for(first_checkpoint, 120, "lm1's first checkpoint")
    wrapper = json.loads((lm1 / "attempts" / "1" / "wrapper.json").read_text())
    os.kill(wrapper["child_pid"], signal.SIGTERM)  # a preemption, as the program sees one

    results: dict[str, subprocess.CompletedProcess] = {}
    submits = [c for c in LOCAL if c.startswith(("orch submit", "orch sweep"))]
    for cmd in submits:
        results[cmd] = run_cmd(cmd, work, env)
    states = wait_for(lambda: all_ended(work, env), 300, "every job to end", interval=1,
                      detail=lambda: status(work, env))
    assert set(states.values()) == {DONE}, states
    attempts = json.loads(run_cmd("orch show lm1 --json", work, env).stdout)["attempts"]
    assert [a["failure_class"] for a in attempts] == ["preempted", None], attempts
    tour = json.loads(run_cmd("orch show tour --json", work, env).stdout)["attempts"]  # as the tour says
    assert [a["failure_class"] for a in tour] == ["preempted", None], tour

    # `orch reconcile --watch 30`: its first pass ends a job whose program already exited; then Ctrl-C.
    assert run_cmd("orch submit --name w -- python train.py --max-steps 2", work, env).returncode == 0
    exit_json = Path(env["ORCH_HOME"]) / "runs" / "w" / "attempts" / "1" / "exit.json"
    wait_for(exit_json.exists, 120, "job w's program to exit")
    # A user's terminal delivers Ctrl-C; CI runs this suite in the background, where SIGINT is inherited ignored
    # (CI: the loop never saw the signal): the default disposition is restored for the user's command.
    watch = subprocess.Popen(["bash", "-c", "exec orch reconcile --watch 30"], cwd=work, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: status(work, env).get("w") == DONE, 120, "the watch loop's first pass to end job w")
    finally:
        watch.send_signal(signal.SIGINT)
    out, err = watch.communicate(timeout=60)
    assert "w: -> done_marker_verified" in out, out + err
    results["orch reconcile --watch 30"] = subprocess.CompletedProcess([], watch.returncode, out, err)
    for cmd in LOCAL:
        if cmd not in results:
            results[cmd] = run_cmd(cmd, work, env)

    wrong = {c: (r.returncode, (r.stderr or r.stdout)[-300:]) for c, r in results.items() if r.returncode != LOCAL[c]}
    assert not wrong, wrong
    tracebacks = [c for c, r in results.items() if "Traceback" in (r.stderr or "")]
    assert not tracebacks, tracebacks
    assert (work / "lm1.png").stat().st_size > 0 and (work / "lm1.log").read_text()
    assert (work / PLACEHOLDERS["DIR"] / "orch.prom").read_text().startswith("#")


def test_the_slurm_tier_runs_every_readme_slurm_command(monkeypatch):
    """tests/slurm/test_readme_commands_slurm.py's AS_RUN_HERE holds each SLURM command (kept in step)."""
    from importlib.util import module_from_spec, spec_from_file_location

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "slurm"))  # its slurmkit
    spec = spec_from_file_location("readme_slurm", ROOT / "tests" / "slurm" / "test_readme_commands_slurm.py")
    assert spec is not None and spec.loader is not None
    mod = module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert set(mod.AS_RUN_HERE) == SLURM
