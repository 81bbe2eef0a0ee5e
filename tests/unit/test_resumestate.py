"""Resume state: what a framework resumes from is never moved to the trash by a requeue, and a
checkpoint of a known layout that would not load is found by structural checks alone. Real files written
by real torch / safetensors; the module under test imports neither."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from orchestrator.core import resumestate
from orchestrator.ops.trash import leftovers_why, unverified_leftovers


def _torch_file(path: Path, legacy: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.arange(4096, dtype=torch.float32), "step": 7}, path,
               _use_new_zipfile_serialization=not legacy)
    return path


def _cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _hf_checkpoint(root: Path, step: int) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    save_file({"w": torch.zeros(1024)}, str(d / "model.safetensors"))
    _torch_file(d / "optimizer.pt")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def test_torch_zip_checks_tell_whole_from_cut_and_empty(tmp_path):
    whole = _torch_file(tmp_path / "a.pt")
    assert resumestate.file_problem(whole) is None
    cut = _torch_file(tmp_path / "b.pt")
    _cut(cut)
    assert "central directory" in resumestate.file_problem(cut)
    with pytest.raises((RuntimeError, OSError)):  # what the script's own resume would do with it
        torch.load(cut)
    empty = tmp_path / "c.ckpt"
    empty.write_bytes(b"")
    assert resumestate.file_problem(empty) == "0 bytes"
    assert resumestate.file_problem(_torch_file(tmp_path / "legacy.pt", legacy=True)) is None


def test_safetensors_checks_its_header_and_the_data_it_declares(tmp_path):
    p = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(1024)}, str(p))
    assert resumestate.file_problem(p) is None
    _cut(p, 0.9)  # header intact, data short
    assert "header says" in resumestate.file_problem(p)
    q = tmp_path / "m2.safetensors"
    save_file({"w": torch.zeros(1024)}, str(q))
    q.write_bytes(q.read_bytes()[:20])  # header cut
    assert "header says" in resumestate.file_problem(q)


def test_hf_checkpoint_dir_without_or_with_a_broken_trainer_state_is_torn(tmp_path):
    good = _hf_checkpoint(tmp_path / "out", 10)
    assert resumestate.problem(good) is None
    bad = _hf_checkpoint(tmp_path / "out", 20)
    (bad / "trainer_state.json").write_text('{"global_step": 2')
    assert "trainer_state.json" in resumestate.problem(bad)
    unfinished = _hf_checkpoint(tmp_path / "out", 30)
    (unfinished / "trainer_state.json").unlink()
    assert "never finished" in resumestate.problem(unfinished)


def test_requeue_keeps_hf_and_lightning_state_and_keep_globs_inside_outputs(tmp_path):
    run = tmp_path / "run"
    _hf_checkpoint(run / "out", 10)
    (run / "out" / "config.json").parent.mkdir(parents=True, exist_ok=True)
    (run / "out" / "config.json").write_text("{}")
    _torch_file(run / "out" / "lightning_logs" / "version_0" / "checkpoints" / "epoch=0-step=5.ckpt")
    (run / "out" / "lightning_logs" / "version_0" / "metrics.csv").write_text("x\n")
    _torch_file(run / "out" / "mine" / "state.pt")
    (run / "out" / "mine" / "notes.txt").write_text("n")
    got = dict(leftovers_why(run, ["out/*"], keep=["out/mine/*.pt"]))
    assert set(got) == {"out/config.json", "out/lightning_logs/version_0/metrics.csv", "out/mine/notes.txt"}, got
    assert all("--outputs out/*" in why for why in got.values())
    # A glob naming the output dir itself: the dir stays, its other entries go.
    assert set(unverified_leftovers(run, ["out"], keep=["out/mine/*.pt"])) == set(got)
    # Without --keep, the user's own format is an ordinary output.
    assert "out/mine" in unverified_leftovers(run, ["out/*"])


def test_torn_state_is_set_aside_renamed_never_deleted_and_then_kept(tmp_path):
    run = tmp_path / "run"
    _hf_checkpoint(run / "out", 10)
    torn_dir = _hf_checkpoint(run / "out", 20)
    _cut(torn_dir / "optimizer.pt")
    mine = run / "ck" / "last.pt"
    mine.parent.mkdir()
    mine.write_bytes(b"")  # torch.save(path) in place, cut by a kill -9
    done = resumestate.set_aside_torn(run, keep=["ck/*.pt"])
    assert sorted(d.path for d in done) == ["ck/last.pt", "out/checkpoint-20"]
    assert all(resumestate.TORN_RE.search(d.as_) and (run / d.as_).exists() for d in done)
    assert not torn_dir.exists() and (run / "out" / "checkpoint-10").is_dir()
    from transformers.trainer_utils import get_last_checkpoint

    assert get_last_checkpoint(str(run / "out")).endswith("checkpoint-10")  # HF's own pick is the good one
    assert unverified_leftovers(run, ["out/*", "ck/*"], keep=["ck/*.pt"]) == []  # set aside stays put
    assert resumestate.set_aside_torn(run, keep=["ck/*.pt"]) == []


def test_keep_is_stored_on_the_job_and_a_keep_outside_the_run_dir_is_refused(orch):
    p = orch("submit", "--name", "k1", "--keep", "ck/*.pt", "--keep", "state/**", "--", sys.executable, "-c", "0")
    assert p.returncode == 0, p.stdout + p.stderr
    assert orch.show("k1")["resources"]["keep"] == ["ck/*.pt", "state/**"]
    bad = orch("submit", "--name", "k2", "--keep", "../x", "--", sys.executable, "-c", "0")
    assert bad.returncode == 2 and "must be a relative glob inside the run dir" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    gone = orch("show", "k2")  # nothing was written: the job does not exist (exit 2, "no job named")
    assert gone.returncode == 2 and "no job named 'k2'" in gone.stderr, gone.stderr
    p = orch("sweep", "--name", "ks", "--grid", "i=1,2", "--keep", "ck/*.pt", "--", sys.executable, "-c", "0")
    assert p.returncode == 0, p.stdout + p.stderr
    assert orch.show("ks.0001")["resources"]["keep"] == ["ck/*.pt"]


def test_the_controller_module_imports_no_torch():
    code = "import sys, orchestrator.core.resumestate, orchestrator.ops.launch; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_a_keep_glob_through_a_symlink_is_neither_read_nor_renamed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "last.pt").write_bytes(b"")  # would be "torn"
    run = tmp_path / "run"
    run.mkdir()
    (run / "ck").symlink_to(outside)
    assert resumestate.set_aside_torn(run, keep=["ck/*.pt"]) == []
    assert (outside / "last.pt").exists() and [p.name for p in outside.iterdir()] == ["last.pt"]


def test_requeue_dry_run_names_what_the_launch_would_set_aside_and_changes_nothing(orch):
    script = "import pathlib; pathlib.Path('ck').mkdir(); pathlib.Path('ck/5.pt').write_bytes(b''); raise SystemExit(1)"
    orch("submit", "--name", "dr", "--outputs", "ck/*", "--keep", "ck/*.pt", "--", sys.executable, "-c", script,
         check=True)
    assert orch.wait("dr", {"retryable_failed", "done_marker_verified"}, timeout=60) == "retryable_failed"
    p = orch("requeue", "--dry-run", "dr")
    assert p.returncode == 0 and "sets aside ck/5.pt (0 bytes)" in p.stdout and "clears" not in p.stdout, p.stdout
    (r,) = orch.json("requeue", "--dry-run", "dr")
    assert r["sets_aside"] == ["ck/5.pt (0 bytes)"] and r["clears"] == []
    assert [x.name for x in (orch.runs / "dr" / "ck").iterdir()] == ["5.pt"]
