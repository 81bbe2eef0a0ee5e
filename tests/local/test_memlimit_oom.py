"""The local backend's --mem: the program runs in a memory cgroup of that limit; the kernel's
OOM kill there is classified ``oom`` (not a bare ``killed``), and the policy doubles --mem. Real cgroup,
real kernel OOM killer, real processes (needs root and a memory cgroup: orchkit.unavailable otherwise)."""

from __future__ import annotations

import json
import os
import sys

from orchkit import unavailable

from orchestrator import protocol
from orchestrator.jobside import memlimit

DONE = "done_marker_verified"
ALLOC = """
import os, pathlib
x = b"x" * (80 << 20)   # more than 64 MB, well under 128 MB
pathlib.Path("result").mkdir(exist_ok=True)
pathlib.Path("result/ok.txt").write_text(f"attempt {os.environ['ORCH_ATTEMPT']}: {len(x)} bytes")
"""


def _need_cgroup() -> None:
    if os.geteuid() != 0 or memlimit.own_memory_cgroup() is None:
        unavailable("needs root and a memory cgroup (v2 delegated or v1) to create an attempt's cgroup in")


def test_a_kernel_oom_kill_at_the_mem_limit_is_oom_and_the_retry_gets_twice_the_memory(orch):
    _need_cgroup()
    orch("submit", "--name", "oom", "--mem", "64M", "--outputs", "result/*", "--", sys.executable, "-c", ALLOC,
         check=True)
    assert orch.wait("oom", {DONE, "failed", "cancelled"}, timeout=120) == DONE, orch.show("oom")
    first, second = orch.show("oom")["attempts"]
    assert first["failure_class"] == "oom" and "OOM killer" in first["detail"], first
    assert first["action"]["action"] == "more_memory" and first["action"]["resources"] == {"mem_mb": 128}, first
    run_dir = orch.runs / "oom"
    ended = json.loads((protocol.attempt_dir(run_dir, 1) / protocol.EXIT_FILE).read_text())
    assert ended["returncode"] == -9 and ended["oom_kill"] >= 1, ended
    assert json.loads((protocol.attempt_dir(run_dir, 2) / protocol.EXIT_FILE).read_text())["oom_kill"] == 0
    assert (run_dir / "result" / "ok.txt").read_text().startswith("attempt 2:")
    parent, _version = memlimit.own_memory_cgroup()
    tokens = {first["token"], second["token"]}
    assert not [p for p in parent.iterdir() if p.name.removeprefix(memlimit.PREFIX) in tokens]  # removed


def test_without_mem_no_cgroup_is_made_and_a_sigkill_stays_killed(orch):
    _need_cgroup()
    parent, _version = memlimit.own_memory_cgroup()
    orch("submit", "--name", "k", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
         check=True)
    assert orch.wait("k", {"retryable_failed", DONE}, timeout=60) == "retryable_failed"
    a = orch.show("k")["attempts"][0]
    assert a["failure_class"] == "killed", a
    ended = json.loads((protocol.attempt_dir(orch.runs / "k", 1) / protocol.EXIT_FILE).read_text())
    assert ended["oom_kill"] is None
    # Named by this attempt's token: CI's other test streams make and remove cgroups of their own meanwhile.
    assert not (parent / f"{memlimit.PREFIX}{a['token']}").exists()


def test_the_cgroup_of_an_attempt_whose_wrapper_was_killed_is_removed_when_it_is_found_gone(orch):
    import signal

    from localkit import wrapper_record

    _need_cgroup()
    orch("submit", "--name", "w9", "--mem", "256M", "--", sys.executable, "-c", "import time; time.sleep(120)",
         check=True)
    rec = wrapper_record(orch.runs / "w9")
    parent, _version = memlimit.own_memory_cgroup()
    cg = parent / f"{memlimit.PREFIX}{rec['token']}"
    assert cg.is_dir()
    os.kill(rec["pid"], signal.SIGKILL)  # the wrapper: it never removes its cgroup
    os.kill(rec["child_pid"], signal.SIGKILL)
    assert orch.wait("w9", {"retryable_failed", "failed"}, timeout=60) == "retryable_failed"
    assert not cg.exists()
