"""A hostile job for the adversarial suite, run by orch as ``python advjob.py [options]``.

It does what a misbehaving (or malicious) program in a run dir can do, then waits for the test to
create ``<run_dir>/go`` (it gives up after ``--give-up`` seconds, so a failed test leaves nothing
behind for long) and ends. It uses only the stdlib and ``orchestrator.protocol`` (the public API a
training script uses to write its own done marker).

  --ckpt               keep appending to an in-progress checkpoint under checkpoints/ (*.tmp-* name)
  --marker             on go: write result/out.txt and its own done.json (protocol.write_done_marker)
  --result             on go: write result/out.txt only (for --outputs result/out.txt)
  --fake-exit          at start: write attempts/<n>/exit.json itself (real token, returncode 0)
  --forge-wrapper PID  at start: rewrite attempts/<n>/wrapper.json with a foreign PID
  --garbage FILE:KIND  at start: replace FILE with garbage of KIND (see KINDS)
  --late-garbage FILE:KIND  on go: a child of the job replaces FILE after the wrapper wrote its exit.json
  --failure CLS        on go: write a valid failure.json of class CLS (step 5)
  --exit-code N        exit status after go (default 0)
  --no-gate            do not wait for go
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from orchestrator import protocol

KINDS = ("fifo", "huge_float", "huge_int", "nan", "negative", "wrong_type", "big", "devzero", "directory")
BIG = 50 * 1024 * 1024
# Numbers of each kind, as JSON text (json.dumps(10**30) is an exact 31-digit literal).
NUMBER = {"huge_float": "1e30", "huge_int": str(10**30), "nan": "NaN", "negative": "-5", "wrong_type": '"many"'}


def env() -> tuple[Path, str, int, str]:
    return (Path(os.environ["ORCH_RUN_DIR"]), os.environ["ORCH_JOB_NAME"], int(os.environ["ORCH_ATTEMPT"]),
            os.environ.get("ORCH_SUBMIT_TOKEN", ""))


def target(name: str) -> Path:
    rd, _job, n, _tok = env()
    if name in (protocol.DONE_MARKER, protocol.RUN_CONFIG):
        return rd / name
    return protocol.attempt_dir(rd, n) / name


def numeric_doc(name: str, num: str) -> str:
    """A JSON document of the file's own shape whose numbers are ``num`` (raw JSON text)."""
    rd, job, n, tok = env()
    if name == protocol.EXIT_FILE:
        return f'{{"returncode": {num}, "signal": null, "token": {json.dumps(tok)}, "time": {time.time()}}}'
    if name == protocol.PROGRESS_FILE:
        return (f'{{"time": {time.time()}, "step": {num}, "loss": {num}, "tokens_per_s": {num}, '
                f'"tokens_per_s_recent": 1.0, "tokens_per_s_median": 2.0, "samples": {num}}}')
    if name == protocol.FAILURE_FILE:
        return f'{{"class": "nan", "step": {num}, "detail": "hostile", "lr": {num}}}'
    if name == protocol.RUN_CONFIG:
        return (f'{{"lr": {num}, "skip_batches": {num}, "resumed_from_step": {num}, "batch_size": {num}, '
                f'"data_sha256": "0"}}')
    if name == "wrapper.json":
        return f'{{"token": {json.dumps(tok)}, "pid": {num}}}'
    return f'{{"schema": 1, "job": {json.dumps(job)}, "attempt": {num}, "artifacts": {{}}}}'


def remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        os.rmdir(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def make_garbage(name: str, kind: str) -> None:
    p = target(name)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".hostile-tmp")
    if kind in NUMBER:
        tmp.write_text(numeric_doc(name, NUMBER[kind]))
        os.replace(tmp, p)
        return
    remove(p)
    if kind == "fifo":
        os.mkfifo(p)  # nobody ever writes it: a blocking open() waits forever
    elif kind == "big":
        with open(p, "wb") as f:  # starts like JSON, then 50 MB (sparse: cheap on disk, not to read)
            f.write(b'{"returncode": 0, "step": 1, "pad": "')
            f.truncate(BIG)
    elif kind == "devzero":
        os.symlink("/dev/zero", p)
    elif kind == "directory":
        os.mkdir(p)
    else:
        raise SystemExit(f"unknown garbage kind {kind}")


def wait_for_token_in(p: Path, tok: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if p.is_file() and tok in p.read_text():
                return True
        except OSError:
            pass
        time.sleep(0.02)
    return False


def wait_for_wrapper_exit(p: Path, tok: str, timeout: float) -> bool:
    """The wrapper's own exit record (it has ``ended_at``; the job's garbage does not)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if p.is_file() and not p.is_symlink() and p.stat().st_size < 65536:
                rec = json.loads(p.read_text())
                if isinstance(rec, dict) and rec.get("token") == tok and "ended_at" in rec:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    return False


def forge_wrapper(pid: int) -> None:
    rd, _job, n, tok = env()
    w = protocol.attempt_dir(rd, n) / "wrapper.json"
    wait_for_token_in(w, tok, 20)  # orch's wrapper writes its own first; then we overwrite it
    try:
        rec = json.loads(w.read_text())
    except (OSError, ValueError):
        rec = {"token": tok}
    rec.update(pid=pid, child_pid=pid)
    protocol.atomic_write_json(w, rec)


def fake_exit() -> None:
    rd, _job, n, tok = env()
    protocol.atomic_write_json(protocol.attempt_dir(rd, n) / protocol.EXIT_FILE, {
        "returncode": 0, "signal": None, "ended_at": protocol.now_iso(), "restart_count": 0, "token": tok,
        "time": time.time(), "time_limit_reached": False})


def late_garbage(specs: list[str]) -> None:
    """Fork a child (same session) that waits for the wrapper's exit.json, then writes garbage."""
    rd, _job, n, tok = env()
    if os.fork() != 0:
        return
    try:
        wait_for_wrapper_exit(protocol.attempt_dir(rd, n) / protocol.EXIT_FILE, tok, 5)
        time.sleep(0.2)
        for spec in specs:
            make_garbage(*spec.split(":", 1))
        (rd / "late.ready").touch()
    finally:
        os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--marker", action="store_true")
    ap.add_argument("--result", action="store_true")
    ap.add_argument("--fake-exit", action="store_true")
    ap.add_argument("--forge-wrapper", type=int)
    ap.add_argument("--garbage", action="append", default=[])
    ap.add_argument("--late-garbage", action="append", default=[])
    ap.add_argument("--failure")
    ap.add_argument("--exit-code", type=int, default=0)
    ap.add_argument("--give-up", type=float, default=60.0)
    ap.add_argument("--no-gate", action="store_true")
    a = ap.parse_args()
    rd, job, n, _tok = env()
    with open(rd / "ran.log", "a") as f:
        f.write(f"attempt={n} pid={os.getpid()}\n")

    if a.forge_wrapper:
        forge_wrapper(a.forge_wrapper)
    if a.fake_exit:
        fake_exit()
    for spec in a.garbage:
        name, kind = spec.split(":", 1)
        if name == "wrapper.json":
            wait_for_token_in(target(name), _tok, 20)  # replace orch's own record, not race it
        make_garbage(name, kind)
    (rd / "started").touch()

    part = None
    if a.ckpt:
        d = rd / protocol.CHECKPOINTS_DIR / "step-00000007.tmp-inprogress"
        d.mkdir(parents=True, exist_ok=True)
        part = d / "model.part"
    deadline = time.monotonic() + a.give_up
    while not a.no_gate and not (rd / "go").exists():
        if time.monotonic() > deadline:
            print("advjob: no go file; giving up", file=sys.stderr)
            return 1
        if part is not None:
            with open(part, "ab") as f:
                f.write(b"w" * 64)
        time.sleep(0.1)

    if a.failure:
        protocol.write_failure(rd, n, a.failure, 5, "hostile job's own report")
    if a.marker or a.result:
        (rd / protocol.RESULT_DIR).mkdir(exist_ok=True)
        protocol.atomic_write(rd / protocol.RESULT_DIR / "out.txt", f"ok {job}\n")
    if a.marker:
        protocol.write_done_marker(rd, job, n, ["result/out.txt"])
    if a.late_garbage:
        late_garbage(a.late_garbage)
    return a.exit_code


if __name__ == "__main__":
    sys.exit(main())
