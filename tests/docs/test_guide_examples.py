"""The guides' "try it" commands, on the scripts in examples/, run as a new user types them from the repository's root
(readmekit.EXAMPLES: a plain loop, Lightning, Hugging Face, submitit, two ranks, a sweep, and the commands that read
them): each gives the exit code the guide implies, and every job they start ends verified."""

from __future__ import annotations

import json

from orchkit import ROOT, wait_for
from readmekit import DONE, EXAMPLES, all_ended, run_cmd, status, user_dir

SUBMITS = [c for c in EXAMPLES if c.startswith(("orch submit", "orch sweep"))]
BLOCKING = [c for c in EXAMPLES if c.startswith("python examples/")]
READS = [c for c in EXAMPLES if c not in SUBMITS and c not in BLOCKING]


def test_every_guide_example_runs_as_written_and_ends_verified(tmp_path):
    work, env = user_dir(tmp_path)
    (work / "examples").symlink_to(ROOT / "examples")  # the repository's root, as far as these commands go
    for cmd in SUBMITS + BLOCKING:
        p = run_cmd(cmd, work, env, timeout=600)
        assert p.returncode == EXAMPLES[cmd], f"{cmd}\n{p.stdout[-2000:]}{p.stderr[-2000:]}"
    states = wait_for(lambda: all_ended(work, env), 600, "every example job to end", interval=1,
                      detail=lambda: status(work, env))
    names = {"loop1", "lit1", "hf1", "loop2"} | {f"loop-lr.{i:04d}" for i in range(4)}
    assert names <= set(states) and len(states) == len(names) + 1, states  # + the submitit example's job
    assert set(states.values()) == {DONE}, states
    for cmd in READS:
        p = run_cmd(cmd, work, env)
        assert p.returncode == EXAMPLES[cmd], f"{cmd}\n{p.stdout[-2000:]}{p.stderr[-2000:]}"
    # The sweep's tasks got their own values: {lr} and {seed} filled in.
    commands = set()
    for i in range(4):
        show = json.loads(run_cmd(f"orch show loop-lr.{i:04d} --json", work, env).stdout)
        commands.add(" ".join(show["command"][-4:]))
    assert commands == {f"--lr {lr} --seed {seed}" for lr in ("1e-3", "3e-3") for seed in (0, 1)}, commands
    loop2 = json.loads(run_cmd("orch show loop2 --json", work, env).stdout)
    assert loop2["attempts"][-1]["world_size"] == 2, loop2["attempts"][-1]
