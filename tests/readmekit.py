"""The README and the docs as a new user reads them: their commands, and the directory and environment such a user runs
them from (their own ``train.py`` on orch's plain-loop integration, ``prepare.sh``, ``runs.jsonl``; ``orch`` and
this venv's ``python`` on PATH). Used by tests/docs/test_readme_commands.py and the Slurm tier's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from orchkit import ROOT

README = ROOT / "README.md"
# What a new user reads: the README and the documentation site's pages (docs/), whose commands are run alike
USER_DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
QUICK_START = ("bash scripts/setup.sh && .venv/bin/orch submit --name demo --wait -- .venv/bin/python -m orch_trainer "
               "--preset tiny")
DONE = "done_marker_verified"
PLACEHOLDERS = {"DIR": "textfile"}  # `orch metrics --textfile DIR`: a directory of the user's

# The guides' "try it" commands, on the examples/ scripts (tests/docs/test_guide_examples.py runs them from a directory
# that holds examples/, as the repository's root does), in the order they run, -> the exit code each must give.
# The submits come first; the submitit example waits for its job; the rest read the jobs once all have ended.
EXAMPLES: dict[str, int] = {
    "orch submit --name loop1 -- python examples/plain_loop.py --max-steps 60": 0,
    "orch submit --name lit1 -- python examples/lightning_train.py --max-steps 40": 0,
    "orch submit --name hf1 -- python examples/hf_train.py --max-steps 40": 0,
    "orch submit --name loop2 --nproc-per-node 2 -- python examples/plain_loop.py --max-steps 60": 0,
    "orch sweep --name loop-lr --grid lr=1e-3,3e-3 --grid seed=0,1 --throttle 2 -- python examples/plain_loop.py "
    "--max-steps 60 --lr {lr} --seed {seed}": 0,
    "python examples/submitit_train.py --backend local --max-steps 60": 0,
    "orch watch loop1": 0,
    "orch show loop1": 0,
    "orch show loop2": 0,
    "orch status --tasks": 0,
    "orch report --since 1h": 0,
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
    """Every ``orch`` command line of the bash blocks of the README and the docs (and the quick start), normalised
    as LOCAL's keys."""
    out: set[str] = set()
    text = "\n".join(page.read_text() for page in USER_DOCS)
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.startswith(("orch ", "bash scripts/setup.sh", "python examples/")):
                continue
            cmd = re.sub(r"\s+#.*$", "", line).strip()
            cmd = re.sub(r"\s+", " ", cmd)
            if "[" not in cmd:
                out.add(cmd)
                continue
            out.add(re.sub(r"\s*\[[^]]*\]", "", cmd))  # without every optional part
            out.add(re.sub(r"\s*\[([^]]*)\]", r" \1", cmd).replace("  ", " "))  # with all of them
    return out


def user_dir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
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


def run_cmd(cmd: str, work: Path, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    for word, value in PLACEHOLDERS.items():
        cmd = re.sub(rf"\b{word}\b", value, cmd)
    return subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)


def status(work: Path, env: dict[str, str]) -> dict[str, str]:
    p = run_cmd("orch status --tasks --json", work, env)
    assert p.returncode == 0, p.stderr
    return {j["name"]: j["state"] for j in json.loads(p.stdout)}


def all_ended(work: Path, env: dict[str, str]) -> dict[str, str] | None:
    assert run_cmd("orch reconcile", work, env).returncode == 0
    states = status(work, env)
    return states if states and all(s in (DONE, "failed", "cancelled") for s in states.values()) else None
