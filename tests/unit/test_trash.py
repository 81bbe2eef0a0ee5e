"""orchestrator.ops.trash: what requeue sets aside is renamed into the trash (undoable until `orch gc`), never deleted
or written through a link (a symlinked trash/ made requeue write outside ORCH_HOME)."""

from __future__ import annotations

import os

import pytest
from orchkit import tree_hash

from orchestrator.core.rundir import ensure_runs_root
from orchestrator.ops.trash import empty_trash, move_to_trash
from orchestrator.protocol import UnsafePath


def test_move_to_trash_renames_what_it_is_given_skips_what_is_gone_and_moves_a_link_not_its_target(cfg, outside):
    ensure_runs_root(cfg)
    rd = cfg.runs_root / "j"
    (rd / "result").mkdir(parents=True)
    (rd / "result" / "model.pt").write_bytes(b"w")
    (rd / "done.json").write_text("{}")
    os.symlink(outside / "sub", rd / "out")
    before = tree_hash(outside)
    moved = move_to_trash(cfg, rd, ["done.json", "result", "out", "missing.txt"], "j")
    assert moved == ["done.json", "result", "out"]
    assert not (rd / "done.json").exists() and not (rd / "result").exists() and not (rd / "out").is_symlink()
    (stamp,) = (cfg.trash / "j").iterdir()
    assert (stamp / "result" / "model.pt").read_bytes() == b"w" and (stamp / "out").is_symlink()
    assert tree_hash(outside) == before  # the link moved; what it points at did not
    assert empty_trash(cfg, "j") >= 1 and not any((cfg.trash / "j").iterdir() if (cfg.trash / "j").exists() else [])


def test_move_to_trash_refuses_a_linked_directory_on_the_way(cfg, outside):
    ensure_runs_root(cfg)
    rd = cfg.runs_root / "k"
    rd.mkdir()
    os.symlink(outside, rd / "checkpoints")
    before = tree_hash(outside)
    with pytest.raises(UnsafePath, match="goes through a symlink"):
        move_to_trash(cfg, rd, ["checkpoints/sub"], "k")
    assert tree_hash(outside) == before
