"""orchestrator.core.rundir: run dirs are confined to the runs root and entered without following symlinks."""

from __future__ import annotations

import pytest
from orchkit import tree_hash

from orchestrator.core.rundir import check_run_dir, ensure_runs_root, make_dir_nofollow
from orchestrator.errors import Refused


def test_a_run_dir_that_is_a_link_a_file_or_holds_a_linked_attempts_dir_is_refused(cfg, outside):
    ensure_runs_root(cfg)
    (cfg.runs_root / "link").symlink_to(outside)
    (cfg.runs_root / "file").write_text("x")
    (cfg.runs_root / "att").mkdir()
    (cfg.runs_root / "att" / "attempts").symlink_to(outside)
    for name, why in (("link", "is a symlink"), ("file", "is not a directory"), ("att", "attempts is a symlink")):
        with pytest.raises(Refused, match=why):
            check_run_dir(cfg, cfg.runs_root / name)
    with pytest.raises(Refused, match="not inside the runs root"):
        check_run_dir(cfg, outside)
    check_run_dir(cfg, cfg.runs_root / "fresh")  # not there yet: fine


def test_make_dir_nofollow_never_creates_through_a_link(tmp_path, outside):
    base = tmp_path / "home" / "trash"
    make_dir_nofollow(base, "job/stamp")
    assert (base / "job" / "stamp").is_dir()
    (base / "evil").symlink_to(outside)
    before = tree_hash(outside)
    with pytest.raises(Refused, match="is a symlink"):
        make_dir_nofollow(base, "evil/x/y")
    assert tree_hash(outside) == before
