"""W&B's side of ``trackers.json`` and of the job's environment: the kit records the run the program logs to (found in
``sys.modules``, never imported), the record is read field by field (the file is the job's), each tracker's entry
survives the other's writes, and orch names the run after the job and tags it with names W&B accepts. The run
marked at the job's end, with the real SDK: tests/integrations/test_wandb_end.py."""

from __future__ import annotations

import json
import sys
import types

import pytest

from orchestrator import protocol
from orchestrator.kit import wandbrecord


def _fake_wandb(monkeypatch: pytest.MonkeyPatch, mode: str = "offline", root: str = "/runs/a") -> types.SimpleNamespace:
    run = types.SimpleNamespace(id="r1", project="proj", entity="", settings=types.SimpleNamespace(mode=mode,
                                                                                                    root_dir=root))
    module = types.SimpleNamespace(run=run)
    monkeypatch.setitem(sys.modules, "wandb", module)
    return run


def test_the_program_s_run_is_recorded_once_beside_the_mlflow_entry(tmp_path, monkeypatch):
    protocol.write_tracker(tmp_path, "mlflow", {"run_id": "m1", "tracking_uri": "sqlite:///x.db"})
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    assert wandbrecord.note(tmp_path, None) is None  # W&B not imported: nothing asked, nothing written
    run = _fake_wandb(monkeypatch, root=str(tmp_path))
    assert wandbrecord.note(tmp_path, None) == "r1"
    assert protocol.wandb_record(tmp_path) == {"run_id": "r1", "project": "proj", "entity": "", "mode": "offline",
                                               "root_dir": str(tmp_path)}
    assert protocol.read_trackers(tmp_path)["mlflow"]["run_id"] == "m1"
    (tmp_path / protocol.TRACKERS_FILE).unlink()
    assert wandbrecord.note(tmp_path, "r1") == "r1" and not (tmp_path / protocol.TRACKERS_FILE).exists()  # noted
    run.id = "r2"  # the program started another run
    assert wandbrecord.note(tmp_path, "r1") == "r2" and protocol.wandb_record(tmp_path)["run_id"] == "r2"


def test_a_disabled_run_or_one_without_settings_is_not_recorded(tmp_path, monkeypatch):
    _fake_wandb(monkeypatch, mode="disabled")
    assert wandbrecord.note(tmp_path, None) is None
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(run=types.SimpleNamespace(id="x")))
    assert wandbrecord.note(tmp_path, None) is None
    assert not (tmp_path / protocol.TRACKERS_FILE).exists()


def test_the_mlflow_entry_written_after_keeps_the_wandb_one(tmp_path, monkeypatch):
    from orchestrator.jobside import mlflowrun

    _fake_wandb(monkeypatch, root=str(tmp_path))
    wandbrecord.note(tmp_path, None)
    mlflowrun._write_record(tmp_path, {"run_id": "m1", "tracking_uri": "file:///m"})
    assert protocol.wandb_record(tmp_path)["run_id"] == "r1" and mlflowrun.read_record(tmp_path)["run_id"] == "m1"


GOOD = {"run_id": "r1", "project": "p", "entity": "e", "mode": "online", "root_dir": "/x"}


@pytest.mark.parametrize("bad", [
    {"run_id": "a/b"}, {"run_id": ""}, {"run_id": 7}, {"project": "a/b"}, {"entity": "a:b"}, {"mode": "disabled"},
    {"root_dir": "relative"}, {"root_dir": "/x\0y"}, {"project": "p" * 129},
])
def test_a_record_w_and_b_would_not_accept_is_no_run(tmp_path, bad):
    protocol.write_tracker(tmp_path, "wandb", {**GOOD, **bad})
    assert protocol.wandb_record(tmp_path) is None


@pytest.mark.parametrize("garbage", [b"", b"[1]", b'{"wandb": 3}', b"\xff\xfe", b'{"wandb": {"run_id": NaN}}'])
def test_garbage_at_trackers_json_is_no_run_and_a_write_replaces_it(tmp_path, garbage):
    (tmp_path / protocol.TRACKERS_FILE).write_bytes(garbage)
    assert protocol.wandb_record(tmp_path) is None and protocol.read_trackers(tmp_path) == {}
    protocol.write_tracker(tmp_path, "wandb", GOOD)
    assert protocol.wandb_record(tmp_path) == GOOD


def test_a_fifo_at_trackers_json_blocks_no_reader(tmp_path):
    import os

    os.mkfifo(tmp_path / protocol.TRACKERS_FILE)
    assert protocol.read_trackers(tmp_path) == {} and protocol.wandb_record(tmp_path) is None


def test_the_run_is_named_after_the_job_grouped_by_its_sweep_and_tagged_within_w_and_b_s_limit():
    env = protocol.tracker_env({}, "/h/runs/j", "j")
    assert (env["WANDB_NAME"], env["WANDB_TAGS"], env["WANDB_RESUME"]) == ("j", "orch.job:j", "allow")
    assert "WANDB_RUN_GROUP" not in env
    task = protocol.tracker_env({protocol.ENV_SWEEP: "sw", protocol.ENV_TASK_INDEX: "3"}, "/h/runs/sw-3", "sw-3")
    assert (task["WANDB_RUN_GROUP"], task["WANDB_TAGS"]) == ("sw", "orch.job:sw-3,orch.sweep:sw,orch.task:3")
    # wandb.init refuses a tag over 64 characters, raising in the user's program: such a tag is left out
    long = "n" * 100
    env = protocol.tracker_env({protocol.ENV_SWEEP: "sw", protocol.ENV_TASK_INDEX: "0"}, "/h/runs/x", long)
    assert env["WANDB_TAGS"] == "orch.sweep:sw,orch.task:0" and env["WANDB_NAME"] == long
    assert "WANDB_TAGS" not in protocol.tracker_env({}, "/h/runs/x", long)
    # the user's own settings win
    own = {"WANDB_NAME": "mine", "WANDB_TAGS": "a,b", "WANDB_RUN_GROUP": "g", protocol.ENV_SWEEP: "sw"}
    assert not {"WANDB_NAME", "WANDB_TAGS", "WANDB_RUN_GROUP"} & set(protocol.tracker_env(own, "/h/runs/x", "x"))


def test_finish_many_marks_nothing_it_cannot_read_and_says_so_in_one_line(tmp_path, capsys):
    from orchestrator.jobside import trackerfinish

    (tmp_path / protocol.TRACKERS_FILE).write_text(json.dumps({"wandb": {**GOOD, "mode": "bogus"}}))
    assert trackerfinish.finish_many(json.dumps([[str(tmp_path), "cancelled"], [str(tmp_path / "gone"), "failed"]]))\
        == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
    assert trackerfinish.main(["nope"]) == 2 and "usage:" in capsys.readouterr().err


def test_a_symlinked_wandb_dir_in_the_run_dir_is_never_written_through(tmp_path, capsys):
    from orchestrator.jobside import trackerfinish

    outside = tmp_path / "outside"
    outside.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb").symlink_to(outside)
    protocol.write_tracker(run_dir, "wandb", {**GOOD, "mode": "offline", "root_dir": str(run_dir)})
    assert trackerfinish.finish_many(json.dumps([[str(run_dir), "cancelled"]])) == 1
    assert "is a symlink: orch writes nothing through it" in capsys.readouterr().err
    assert list(outside.iterdir()) == [] and "end" not in protocol.wandb_record(run_dir)


def test_no_w_and_b_mark_starts_without_the_time_to_finish_it(tmp_path, capsys):
    """The child has 60 s for every job one command ended (a large sweep cancelled): a resume begun at its end
    would be cut by the alarm, leaving the run resumed ("running") instead of as its last process left it."""
    import time

    from orchestrator.jobside import trackerfinish

    protocol.write_tracker(tmp_path, "wandb", {**GOOD, "mode": "offline", "root_dir": str(tmp_path)})
    with pytest.raises(TimeoutError, match="no time left"):
        trackerfinish.finish_wandb(tmp_path, "cancelled", deadline=time.monotonic() + 1)
    assert not (tmp_path / "wandb").exists() and "end" not in protocol.wandb_record(tmp_path)
