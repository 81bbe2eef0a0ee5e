"""memlimit: which memory cgroup the wrapper uses, from /proc/self/cgroup and mountinfo as recorded on a
hybrid host (v2 without the memory controller, v1 memory) and on a v2 host with it delegated. The cgroup
file system is stood in for by plain files (a unit test); tests/local/test_memlimit_oom.py uses the real one."""

from __future__ import annotations

from pathlib import Path

from orchestrator.jobside import memlimit

HYBRID_CGROUP = "4:memory:/process_api/d45a\n0::/\n1:cpu:/\n"
V2_CGROUP = "0::/user.slice/orch.service\n"


def _mountinfo(root: Path) -> str:
    return (f"31 23 0:28 / {root}/fs rw,relatime - tmpfs tmpfs rw\n"
            f"35 31 0:32 / {root}/memory rw,relatime - cgroup cgroup rw,memory\n"
            f"41 31 0:38 / {root}/unified rw,relatime - cgroup2 cgroup2 rw\n")


def _dir(p: Path, files: dict[str, str]) -> Path:
    p.mkdir(parents=True)
    for k, v in files.items():
        (p / k).write_text(v)
    return p


def test_hybrid_host_uses_v1_memory_when_v2_has_no_memory_controller(tmp_path):
    _dir(tmp_path / "unified", {"cgroup.subtree_control": "pids\n"})
    v1 = _dir(tmp_path / "memory" / "process_api" / "d45a", {"memory.limit_in_bytes": "9223372036854771712\n"})
    assert memlimit.own_memory_cgroup(HYBRID_CGROUP, _mountinfo(tmp_path)) == (v1, 1)


def test_v2_with_the_memory_controller_delegated_limits_and_counts_oom_kills(tmp_path):
    own = _dir(tmp_path / "unified" / "user.slice" / "orch.service", {"cgroup.subtree_control": "cpu memory pids\n"})
    assert memlimit.own_memory_cgroup(V2_CGROUP, _mountinfo(tmp_path)) == (own, 2)
    cg, why = memlimit.create("abc123", 64, own=(own, 2))
    assert why is None and cg.path == own / "orch-abc123"
    assert (cg.path / "memory.max").read_text() == str(64 << 20)
    (cg.path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n")
    assert cg.oom_kills() == 2


def test_v1_counter_is_the_oom_control_line(tmp_path):
    own = _dir(tmp_path / "m", {"memory.limit_in_bytes": "1"})
    cg, why = memlimit.create("t1", 128, own=(own, 1))
    assert why is None and (cg.path / "memory.limit_in_bytes").read_text() == str(128 << 20)
    (cg.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert cg.oom_kills() == 3


def test_no_usable_cgroup_says_why(tmp_path):
    _dir(tmp_path / "unified", {"cgroup.subtree_control": ""})
    assert memlimit.own_memory_cgroup("0::/\n", _mountinfo(tmp_path)) is None
    assert memlimit.create("../x", 64)[1].endswith("is not a cgroup name")
