#!/usr/bin/env python3
"""Bring your own trainer: steps redone per SIGTERM preemption and lines of orch code, per framework.

For each of the plain-loop, Lightning and Hugging Face examples (``examples/*.py``) and the bundled
trainer (the reference), a job is submitted through the real CLI on the local backend, its program is
sent SIGTERM (``os.kill``, found by a /proc scan of environs for its run dir) ``--preemptions`` times,
each time after it posted progress past a random step, and ``orch reconcile`` requeues it until it is
``done_marker_verified``. Measured:

* steps redone per preemption: optimizer steps computed more than once (each example appends every
  completed step to a log; the bundled trainer prints each step with ``--log-interval 1``), divided by
  the number of preemptions;
* exactness: the final weights against the same script run once without interruption (bit for bit);
* lines of orch code: lines of the example that mention orch (marked ``# orch``), required and optional;
* kill -9 mid-save: a second job with periodic checkpoints gets SIGKILL while a checkpoint is being
  written (a ``.tmp-`` dir under checkpoints/, or HF's ``checkpoint-N`` in its output dir, seen by polling);
  no signal, no record: orch must classify it ``killed``, requeue it by itself and resume from the last good
  checkpoint. Steps redone = steps computed twice;
* an exception after training: a third job whose script raises after training ends (a failed export): its
  final state must be ``retryable_failed`` (``crash``), never verified;
* SIGTERM to the program alone: the preemptions above are ``os.kill`` of the program's pid, never through orch's
  wrapper: the final state must be verified only after the resumed attempts completed.

Usage: ``.venv/bin/python bench/bench_integrations.py [--preemptions N] [--only NAME] [--no-write]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C

from orchestrator import protocol

EXAMPLES = C.ROOT / "examples"
TRAINER_STEP_RE = re.compile(r"\[trainer\] step (\d+)/")
ORCH_MARK = re.compile(r"\s# orch\b")


@dataclass
class Case:
    name: str
    script: str | None  # examples/<script>; None: the bundled trainer
    max_steps: int
    args: list[str]
    weights: Callable[[Path], dict]


def _torch_weights(rel: str, key: str | None = None) -> Callable[[Path], dict]:
    def load(run_dir: Path) -> dict:
        import torch

        obj = torch.load(run_dir / rel, weights_only=False, map_location="cpu")
        return obj[key] if key else obj
    return load


def _safetensors(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(run_dir / "result" / "model.safetensors")


CASES = [
    Case("plain loop (orch_run)", "plain_loop.py", 150, ["--save-every", "50"], _torch_weights("result/model.pt")),
    Case("Lightning (OrchCallback)", "lightning_train.py", 150, [], _torch_weights("result/model.ckpt", "state_dict")),
    Case("Hugging Face Trainer (OrchCallback)", "hf_train.py", 150, [], _safetensors),
    Case("bundled trainer (reference)", None, 300, [], _torch_weights("result/model.pt")),
]


def argv(case: Case, run_dir: Path | None, slow: bool) -> list[str]:
    if case.script is None:
        a = [C.PY, "-m", "orch_trainer", "--preset", "tiny", "--threads", "1", "--max-steps", str(case.max_steps),
             "--log-interval", "1", "--heartbeat-interval", "0.1", "--save-interval", "100"]
        return a + (["--run-dir", str(run_dir)] if run_dir else [])
    a = [C.PY, str(EXAMPLES / case.script), "--max-steps", str(case.max_steps), *case.args]
    return a + (["--sleep-per-step", "0.03"] if slow else []) + (["--run-dir", str(run_dir)] if run_dir else [])


def env(home: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_", "WANDB_"))}
    e.update(ORCH_HOME=str(home), ORCH_HEARTBEAT_S="0.1", WANDB_MODE="offline", HF_HUB_OFFLINE="1",
             PYTHONUNBUFFERED="1", PYTHONPATH=str(C.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return e


def orch(home: Path, *args: str) -> subprocess.CompletedProcess:
    p = subprocess.run([C.PY, "-m", "orchestrator.cli", *args], capture_output=True, text=True, env=env(home),
                       cwd=str(C.ROOT), timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"orch {' '.join(args)}: {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def program_pid(run_dir: Path, needle_cmd: str) -> int | None:
    needle = f"{protocol.ENV_RUN_DIR}={run_dir}".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0") and \
                        needle_cmd.encode() in (d / "cmdline").read_bytes():
                    return int(d.name)
            except OSError:
                continue
    return None


def steps_done(case: Case, run_dir: Path, log: Path) -> list[int]:
    if case.script is not None:
        return [int(line.split()[1]) for line in log.read_text().splitlines() if line.strip()]
    out = []
    for f in sorted((run_dir / protocol.ATTEMPTS_DIR).glob("*/stderr.log"), key=lambda p: int(p.parent.name)):
        out += [int(m.group(1)) for m in TRAINER_STEP_RE.finditer(f.read_text())]
    return out


def run_case(case: Case, work: Path, preemptions: int, rng: random.Random) -> dict:
    home = work / "home"
    name = re.sub(r"[^a-z]+", "-", case.name.lower()).strip("-")[:40]
    log = work / "steps.log"
    cmd = argv(case, None, slow=True) + ([] if case.script is None else ["--step-log", str(log)])
    t0 = time.perf_counter()
    orch(home, "submit", "--name", name, "--", *cmd)
    run_dir = home / "runs" / name
    needle = case.script or "trainer"
    resumed = 0
    for attempt in range(1, preemptions + 1):
        past = resumed + rng.randint(10, max(11, case.max_steps // (preemptions + 2)))
        deadline = time.time() + 300
        while True:
            orch(home, "reconcile")
            step = int((protocol.read_progress(run_dir, attempt) or {}).get("step") or 0)
            if step > past and (pid := program_pid(run_dir, needle)):
                break
            if time.time() > deadline:
                raise RuntimeError(f"{name} attempt {attempt} never passed step {past}")
            time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        while not (protocol.attempt_dir(run_dir, attempt) / protocol.FAILURE_FILE).exists():
            if time.time() > deadline:
                raise RuntimeError(f"{name} attempt {attempt} wrote no failure.json")
            time.sleep(0.05)
        resumed = protocol.read_failure(run_dir, attempt)["step"]
    deadline = time.time() + 300
    while json.loads(orch(home, "show", name, "--json").stdout)["state"] != "done_marker_verified":
        if time.time() > deadline:
            raise RuntimeError(f"{name} not verified: {orch(home, 'show', name).stdout}")
        orch(home, "reconcile")
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    steps = steps_done(case, run_dir, log)
    redone = sum(n - 1 for n in collections.Counter(steps).values() if n > 1)
    missing = set(range(1, case.max_steps + 1)) - set(steps)

    ref = work / "ref"
    ref.mkdir()
    p = subprocess.run(argv(case, ref, slow=False), cwd=ref, env=env(home), capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"reference run of {name} failed:\n{p.stderr[-2000:]}")
    a, b = case.weights(run_dir), case.weights(ref)
    import torch

    exact = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    attempts = json.loads(orch(home, "show", name, "--json").stdout)["attempts"]
    return {"redone": redone, "missing": len(missing), "exact": exact, "wall": wall,
            "classes": [x["failure_class"] for x in attempts[:-1]], "attempts": len(attempts)}


# Periodic checkpoints for the kill -9 runs (a kill gives no signal: only a periodic save limits the loss).
PERIODIC = {"plain_loop.py": ["--save-every", "25"], "lightning_train.py": ["--save-every", "25"],
            "hf_train.py": ["--save-steps", "25"], None: ["--save-interval", "25"]}


def _saving(run_dir: Path) -> bool:
    """A checkpoint is being written right now: a tmp dir under checkpoints/ (orch's commit, the kit's
    background save, the trainer's), or an HF ``checkpoint-N`` not yet moved out of its output dir."""
    ck = run_dir / protocol.CHECKPOINTS_DIR
    try:
        if ck.is_dir() and any(protocol.TMP_INFIX in p.name for p in ck.iterdir()):
            return True
        out = run_dir / "out"
        return out.is_dir() and any(p.name.startswith("checkpoint-") for p in out.iterdir())
    except OSError:
        return False


def run_kill9(case: Case, work: Path, rng: random.Random) -> dict:
    """SIGKILL the program mid-save (else, if no save is caught within the window, at a random step)."""
    home = work / "home"
    home.mkdir(parents=True)
    (home / "orch.toml").write_text("[policy]\ncrash_backoff_s = 1\n")  # the bench should not wait 30 s
    name = "k9-" + re.sub(r"[^a-z]+", "-", case.name.lower()).strip("-")[:36]
    log = work / "steps.log"
    cmd = [*argv(case, None, slow=True), *PERIODIC[case.script]]
    cmd += [] if case.script is None else ["--step-log", str(log)]
    orch(home, "submit", "--name", name, "--", *cmd)
    run_dir = home / "runs" / name
    needle = case.script or "trainer"
    after = rng.randint(30, case.max_steps // 2)
    deadline, mid_save, pid = time.time() + 300, False, None
    while time.time() < deadline:
        step = int((protocol.read_progress(run_dir, 1) or {}).get("step") or 0)
        pid = program_pid(run_dir, needle)
        if pid and step >= after and _saving(run_dir):
            mid_save = True
            break
        if pid and step >= after + 40:  # no save caught in the window: kill at this step
            break
        time.sleep(0.002)
    if pid is None:
        raise RuntimeError(f"{name}: the program never ran past step {after}")
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 300
    while (state := json.loads(orch(home, "show", name, "--json").stdout)["state"]) != "done_marker_verified":
        if time.time() > deadline or state in ("failed", "cancelled"):
            raise RuntimeError(f"{name} not recovered ({state}): {orch(home, 'show', name).stdout}")
        orch(home, "reconcile")
        time.sleep(0.2)
    steps = steps_done(case, run_dir, log)
    attempts = json.loads(orch(home, "show", name, "--json").stdout)["attempts"]
    return {"redone": sum(n - 1 for n in collections.Counter(steps).values() if n > 1), "mid_save": mid_save,
            "class": attempts[0]["failure_class"], "attempts": len(attempts)}


def run_exception_after_training(case: Case, work: Path) -> dict:
    """The script raises right after training ends (a failed export): never verified, orch says crash."""
    home = work / "home"
    name = "ex-" + re.sub(r"[^a-z]+", "-", case.name.lower()).strip("-")[:36]
    cmd = argv(case, None, slow=False)
    if case.script is None:  # the bundled trainer, then a failing export step in the same job
        cmd = ["sh", "-c", " ".join(map(shlex.quote, cmd)) + " && echo 'export failed' >&2 && exit 1"]
    else:
        cmd += ["--fail-after-train"]
    p = subprocess.run([C.PY, "-m", "orchestrator.cli", "submit", "--name", name, "--wait", "--", *cmd],
                       capture_output=True, text=True, env=env(home), cwd=str(C.ROOT), timeout=600)
    show = json.loads(orch(home, "show", name, "--json").stdout)
    verified = subprocess.run([C.PY, "-m", "orchestrator.cli", "verify", name], capture_output=True, text=True,
                              env=env(home), cwd=str(C.ROOT), timeout=120).returncode == 0
    return {"state": show["state"], "class": show["attempts"][-1]["failure_class"], "wait_rc": p.returncode,
            "verified": verified}


def orch_lines(case: Case) -> str:
    if case.script is None:
        return "0 (it is orch's)"
    # Code lines ending in a "# orch" comment (not the docstring that explains the marker).
    lines = [ln for ln in (EXAMPLES / case.script).read_text().splitlines()
             if ORCH_MARK.search(ln) and not ln.lstrip().startswith("#")]
    optional = [ln for ln in lines if "# orch (optional" in ln]
    return f"{len(lines) - len(optional)}" + (f" (+{len(optional)} optional)" if optional else "")


HEADERS = ["framework", "SIGTERM to the program", "steps redone per preemption", "final weights vs uninterrupted",
           "SIGTERM to the program: final state", "kill -9 mid-save: steps redone", "exception after training: "
           "final state", "lines of orch code", "wall (preemptions)"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preemptions", type=int, default=2)
    ap.add_argument("--only", default=None, help="run only the cases whose name contains this")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    C.add_quick(ap)
    a = ap.parse_args()
    if a.quick:  # one case runs the whole machinery; tests/integrations covers every framework
        a.preemptions, a.no_write, a.only = 1, True, a.only or "plain loop"
    rng = random.Random(a.seed)
    rows = []
    for case in CASES:
        if a.only and a.only.lower() not in case.name.lower():
            continue
        with tempfile.TemporaryDirectory(prefix="bench-int-") as tmp:
            r = run_case(case, Path(tmp), a.preemptions, rng)
        with tempfile.TemporaryDirectory(prefix="bench-int-k9-") as tmp:
            k9 = run_kill9(case, Path(tmp), rng)
        with tempfile.TemporaryDirectory(prefix="bench-int-ex-") as tmp:
            ex = run_exception_after_training(case, Path(tmp))
        per = r["redone"] / a.preemptions
        rows.append([case.name, f"{a.preemptions} (classes: {', '.join(sorted(set(r['classes'])))})",
                     f"{per:.1f} ({r['redone']} in all, {r['missing']} missing)",
                     "bit-exact" if r["exact"] else "differs",
                     f"verified after {r['attempts']} attempts (never before)",
                     f"{k9['redone']} ({'mid-save' if k9['mid_save'] else 'no save caught'}; {k9['class']}, "
                     f"auto-requeued, verified)",
                     f"{ex['state']} ({ex['class']}; --wait exit {ex['wait_rc']}; "
                     f"{'VERIFIED' if ex['verified'] else 'not verified'})",
                     orch_lines(case), f"{r['wall']:.0f} s"])
        print(C.table(HEADERS, rows[-1:]), flush=True)
    headers = HEADERS
    table = C.table(headers, rows)
    print(table)
    if a.no_write or a.only:
        return
    notes = (
        "Each job runs through the real CLI on the local backend and its PROGRAM (not orch's wrapper) is sent "
        f"SIGTERM {a.preemptions} times "
        "(after it posted progress past a random step); `orch reconcile` requeues it each time until it is "
        "`done_marker_verified`. Steps redone are optimizer steps computed more than once (from each "
        "script's per-step log). Final weights are compared bit for bit with the same script run once "
        "without interruption. Lines of orch code: lines of `examples/*.py` marked `# orch` (the optional "
        "ones add a tracker's continuity or a progress field). The examples run 30 ms per step "
        "(`--sleep-per-step`) so the signal lands mid-run; the bundled trainer runs at its own speed. "
        "kill -9 mid-save: a second job saving every 25 steps gets SIGKILL while a checkpoint is being written "
        "(polled every 2 ms for a `.tmp-` dir or HF's `checkpoint-N`; 'no save caught' means the kill came at a "
        "random step instead); orch classifies it `killed` and requeues it by itself (`crash_backoff_s = 1` "
        "here). Exception after training: a third job whose script raises after training ends (the bundled "
        "trainer: `python -m orch_trainer ... && exit 1`), through `orch submit --wait`: exit 4, never verified.\n\n"
        "Exact resume needs, besides model/optimizer/scheduler: the global RNG (orch_run and the Lightning "
        "callback save it; HF saves its own), and the data position: the plain loop draws batches from the "
        "restored RNG, HF skips the batches already seen, Lightning needs a resumable loader (the example "
        "uses torchdata's `StatefulDataLoader`; with a plain `DataLoader` Lightning restarts the epoch's "
        "iterator: 0 steps redone, not bit-exact)."
    )
    C.replace_section("Bring your own trainer (integrations)", C.preamble("bench_integrations.py", notes)
                      + "\n" + table + "\n")


if __name__ == "__main__":
    main()
