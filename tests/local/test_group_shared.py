"""``[runs] group_shared = true`` shares run dirs and logs with the owner's group (it had no test before).

A lab that shares one runs root reads each other's logs and results through the group: the run dir and what
is in it must be group-readable (0750 dirs, 0640 files), never world-readable; without the setting, private."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

CMD = [sys.executable, "-c", "import os; os.makedirs('result', exist_ok=True); open('result/out.txt', 'w').write('x')"]


def _modes(run_dir: Path) -> dict[str, int]:
    paths = [run_dir, run_dir / "attempts", run_dir / "attempts" / "1", run_dir / "attempts" / "1" / "stdout.log",
             run_dir / "attempts" / "1" / "exit.json", run_dir / "result", run_dir / "result" / "out.txt",
             run_dir / "done.json"]
    return {str(p.relative_to(run_dir.parent)): stat.S_IMODE(p.stat().st_mode) for p in paths}


@pytest.mark.parametrize("shared", [True, False])
def test_group_shared_run_dirs_are_group_readable_and_never_world_readable(orch, shared):
    if shared:
        orch.write_config("[runs]\ngroup_shared = true\n")
    p = orch("submit", "--name", "gs", "--outputs", "result/*", "--wait", "--", *CMD)
    assert p.returncode == 0, p.stdout + p.stderr
    modes = _modes(orch.runs / "gs")
    for path, mode in modes.items():
        assert not mode & 0o007, f"{path} is world-accessible: {oct(mode)}"
        is_dir = not Path(path).suffix and not path.endswith("log")
        if shared:
            want = 0o050 if is_dir else 0o040
            assert mode & 0o070 == want, f"{path}: {oct(mode)}, group should have {oct(want)}"
        else:
            assert not mode & 0o070, f"{path} is group-accessible without group_shared: {oct(mode)}"
