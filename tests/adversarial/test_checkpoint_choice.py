"""A checkpoint is chosen only after its sha256 verifies: a same-size bit flip in the newest
checkpoint before a NaN rollback (or before a requeue) sends that checkpoint to trash and resumes
from the next older verified one; the job finishes instead of failing for good."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from advkit import PY, assert_no_stuck, flip_byte, live_job_procs, settle, show
from orchkit import make_checkpoint, wait_for

from orchestrator import protocol

TRAINER = [PY, "-m", "orch_trainer", "--preset", "tiny", "--max-steps", "40", "--save-interval", "5",
           "--keep-last-k", "4", "--inject-fault", "nan@step=22"]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _trashed(home: Path, job: str, rel: str) -> list[Path]:
    """Files trashed for ``job`` whose path inside the stamp dir is ``rel``."""
    out = []
    for root in (home / "trash" / job, home / "runs" / ".orch-trash" / job):
        if root.is_dir():
            out += [p for stamp in root.iterdir() if (p := stamp / rel).exists()]
    return out


def _nan_reported_and_gone(run: Path) -> bool:
    f = protocol.attempt_dir(run, 1) / "failure.json"
    try:
        cls = json.loads(f.read_text()).get("class")
    except (OSError, ValueError):
        return False
    return cls == "nan" and not live_job_procs(run)


def test_nan_rollback_never_resumes_from_a_bit_flipped_checkpoint(orch):
    """A NaN rollback picked a checkpoint whose bytes were corrupted without changing its
    size (only sizes were checked on that path); ... the job ended failed for good."""
    run = orch.runs / "nanjob"
    p = orch("submit", "--name", "nanjob", "--", *TRAINER)
    assert p.returncode == 0, p.stderr
    # No reconcile yet (it would decide the rollback at once): wait on the observable end instead.
    wait_for(lambda: _nan_reported_and_gone(run), 90, "attempt 1 to report nan and exit", interval=0.1)
    model = run / "checkpoints" / "step-00000020" / "model.pt"
    assert model.is_file(), sorted(os.listdir(run / "checkpoints"))
    flip_byte(model)
    flipped = _sha(model)

    settle(orch, ["nanjob"], timeout=120)
    d = show(orch, "nanjob")
    summary = [(a["n"], a["state"], a["failure_class"], (a["action"] or {}).get("action"),
                ((a["action"] or {}).get("details") or {}).get("resume_step"), (a["detail"] or "")[:120])
               for a in d["attempts"]]
    assert d["state"] == "done_marker_verified", (d["state"], summary)
    a1 = d["attempts"][0]
    assert a1["failure_class"] == "nan", a1
    resume = ((a1["action"] or {}).get("details") or {}).get("resume_step")
    assert isinstance(resume, int) and resume <= 15, f"rollback resumed from {resume!r}: {a1['action']}"
    assert any(_sha(p) == flipped for p in _trashed(orch.home, "nanjob", "checkpoints/step-00000020/model.pt")), \
        "the corrupt step-00000020 is not in the trash"
    assert protocol.verify_done_marker(run).verified
    for ck in protocol.iter_checkpoint_dirs(run):  # whatever is committed now verifies
        assert protocol.verify_checkpoint(ck) is None, ck
    assert_no_stuck(orch)


def test_requeue_trashes_a_bit_flipped_checkpoint_and_keeps_the_intact_one(orch):
    """Requeue kept such checkpoints too, though the README says corrupt ones go to trash."""
    p = orch("submit", "--name", "rq", "--", "sh", "-c", "exit 1")
    assert p.returncode == 0, p.stderr
    rows = settle(orch, ["rq"])
    assert rows["rq"]["state"] == "retryable_failed", rows["rq"]
    run = orch.runs / "rq"
    good = make_checkpoint(run, 5, {"model.pt": os.urandom(4096)})
    bad = make_checkpoint(run, 10, {"model.pt": os.urandom(4096)})
    flip_byte(bad / "model.pt")
    flipped = _sha(bad / "model.pt")
    good_hash = _sha(good / "model.pt")

    r = orch("requeue", "rq")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert not bad.exists(), "a corrupt checkpoint was kept for the next attempt to resume from"
    assert protocol.verify_checkpoint(good) is None and _sha(good / "model.pt") == good_hash
    assert any(_sha(p) == flipped for p in _trashed(orch.home, "rq", "checkpoints/step-00000010/model.pt")), \
        "the corrupt checkpoint is not in the trash"
    settle(orch, ["rq"])
    assert_no_stuck(orch)
