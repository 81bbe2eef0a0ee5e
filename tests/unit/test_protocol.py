"""The run-dir protocol: THE completion predicate, atomic writes, checkpoints, failure reports, names.

Every "done" decision in orch rests on ``verify_done_marker`` (seed 000: a "non-empty dir" guard and
a "result.json exists" requeue disagreed on exactly the state a failure leaves behind), so these
tests attack it from every side: bytes changed, files cut, paths that escape, symlinks, wrong
types, hostile sizes, and a writer killed between every step of the write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from orchkit import make_checkpoint

from orchestrator import protocol
from orchestrator.protocol import MarkerStatus, UnsafePath

ROOT = Path(__file__).resolve().parents[2]
MODEL_BYTES = bytes(range(256)) * 64  # 16 KiB
METRICS = b'{"loss": 1.25}\n'


def make_finished_run(run_dir: Path) -> dict:
    """A run dir as a finished job leaves it: two result files, then done.json."""
    (run_dir / "result").mkdir(parents=True)
    (run_dir / "result" / "model.bin").write_bytes(MODEL_BYTES)
    (run_dir / "result" / "metrics.json").write_bytes(METRICS)
    return protocol.write_done_marker(run_dir, "job1", 1, ["result/model.bin", "result/metrics.json"])


def rewrite_marker(run_dir: Path, mutate) -> None:
    m = json.loads((run_dir / "done.json").read_text())
    mutate(m)
    (run_dir / "done.json").write_text(json.dumps(m))


def assert_corrupt(run_dir: Path, *needles: str) -> protocol.Verification:
    v = protocol.verify_done_marker(run_dir)
    assert v.status is MarkerStatus.CORRUPT, v
    assert not v.verified
    for n in needles:
        assert n in v.reason, f"reason {v.reason!r} does not mention {n!r}"
    return v


# =========================================================================================
# the completion predicate
# =========================================================================================
def test_written_marker_verifies_and_lists_every_artifact_with_size_and_sha256(tmp_path):
    marker = make_finished_run(tmp_path)
    v = protocol.verify_done_marker(tmp_path)
    assert v.status is MarkerStatus.VERIFIED and v.verified and str(v) == "VERIFIED"
    import hashlib

    assert marker["schema"] == 1 and marker["job"] == "job1" and marker["attempt"] == 1
    assert marker["artifacts"] == {
        "result/model.bin": {"size": len(MODEL_BYTES), "sha256": hashlib.sha256(MODEL_BYTES).hexdigest()},
        "result/metrics.json": {"size": len(METRICS), "sha256": hashlib.sha256(METRICS).hexdigest()},
    }
    assert json.loads((tmp_path / "done.json").read_text()) == marker == v.marker
    assert "T" in marker["finished_at"]  # iso8601


def test_missing_marker_is_absent_even_when_the_run_dir_is_full_of_results(tmp_path):
    make_finished_run(tmp_path)
    (tmp_path / "done.json").unlink()
    (tmp_path / "attempts" / "1").mkdir(parents=True)
    (tmp_path / "attempts" / "1" / "command.json").write_text("{}")
    v = protocol.verify_done_marker(tmp_path)
    assert v.status is MarkerStatus.ABSENT and not v.verified
    assert "done.json" in v.reason
    assert protocol.verify_done_marker(tmp_path / "does-not-exist").status is MarkerStatus.ABSENT


def test_one_changed_byte_in_an_artifact_makes_the_marker_corrupt(tmp_path):
    make_finished_run(tmp_path)
    p = tmp_path / "result" / "model.bin"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    assert_corrupt(tmp_path, "result/model.bin", "sha256")


def test_truncated_artifact_makes_the_marker_corrupt_naming_the_size(tmp_path):
    make_finished_run(tmp_path)
    p = tmp_path / "result" / "model.bin"
    os.truncate(p, 100)
    assert_corrupt(tmp_path, "result/model.bin", "size 100", str(len(MODEL_BYTES)))


def test_deleted_artifact_makes_the_marker_corrupt_naming_it_missing(tmp_path):
    make_finished_run(tmp_path)
    (tmp_path / "result" / "metrics.json").unlink()
    assert_corrupt(tmp_path, "result/metrics.json", "missing")


def test_artifact_replaced_by_a_directory_is_corrupt(tmp_path):
    make_finished_run(tmp_path)
    (tmp_path / "result" / "metrics.json").unlink()
    (tmp_path / "result" / "metrics.json").mkdir()
    assert_corrupt(tmp_path, "result/metrics.json", "missing")


def test_every_prefix_of_the_marker_is_corrupt_never_verified(tmp_path):
    # A marker cut short (a writer that did not use tmp+rename, a torn copy) must never verify.
    make_finished_run(tmp_path)
    full = (tmp_path / "done.json").read_bytes()
    for cut in range(0, len(full) - 1):  # the full text minus its final "}" (and shorter)
        (tmp_path / "done.json").write_bytes(full[:cut])
        v = protocol.verify_done_marker(tmp_path)
        assert v.status is MarkerStatus.CORRUPT, (cut, v)
    (tmp_path / "done.json").write_bytes(full[: len(full) // 2])
    assert_corrupt(tmp_path, "not valid JSON")
    (tmp_path / "done.json").write_bytes(full)
    assert protocol.verify_done_marker(tmp_path).verified


@pytest.mark.parametrize("rel", ["../outside.bin", "/ABS/outside.bin", "result/../../outside.bin",
                                 "./result/model.bin", "result//model.bin", "result/./model.bin",
                                 "result\\model.bin", "", "result/model.bin\x00"])
def test_artifact_path_that_leaves_the_run_dir_is_corrupt_even_if_the_file_matches(tmp_path, rel):
    run = tmp_path / "run"
    make_finished_run(run)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(MODEL_BYTES)  # size and hash match: only the path is wrong
    rel = rel.replace("/ABS", str(tmp_path))
    good = json.loads((run / "done.json").read_text())["artifacts"]["result/model.bin"]
    rewrite_marker(run, lambda m: m["artifacts"].update({rel: good}))
    v = assert_corrupt(run)
    assert repr(rel) in v.reason, v.reason


def test_symlinked_artifact_is_corrupt_even_when_its_target_matches(tmp_path):
    make_finished_run(tmp_path)
    real = tmp_path / "result" / "model.bin"
    target = tmp_path / "model.real"
    os.rename(real, target)
    os.symlink(target, real)
    assert protocol.sha256_file(real)[0] == len(MODEL_BYTES)  # the link resolves to the right bytes
    assert_corrupt(tmp_path, "symlink", "model.bin")


def test_artifact_below_a_symlinked_directory_is_corrupt(tmp_path):
    run = tmp_path / "run"
    make_finished_run(run)
    elsewhere = tmp_path / "elsewhere"
    os.rename(run / "result", elsewhere)
    os.symlink(elsewhere, run / "result")
    assert_corrupt(run, "symlink", "result")


def test_symlinked_marker_is_corrupt(tmp_path):
    run = tmp_path / "run"
    make_finished_run(run)
    os.rename(run / "done.json", tmp_path / "done.real")
    os.symlink(tmp_path / "done.real", run / "done.json")
    assert_corrupt(run, "done.json", "symlink")


def test_symlinked_run_dir_is_corrupt(tmp_path):
    real = tmp_path / "real"
    make_finished_run(real)
    os.symlink(real, tmp_path / "link")
    assert_corrupt(tmp_path / "link", "run dir is a symlink")


WRONG_TYPES = [
    ("schema 2", lambda m: m.update(schema=2), "schema"),
    ("schema as string", lambda m: m.update(schema="1"), "schema"),
    ("no schema", lambda m: m.pop("schema"), "schema"),
    ("job not a string", lambda m: m.update(job=5), "job/attempt"),
    ("attempt as string", lambda m: m.update(attempt="1"), "job/attempt"),
    ("no attempt", lambda m: m.pop("attempt"), "job/attempt"),
    ("artifacts empty", lambda m: m.update(artifacts={}), "lists no files"),
    ("artifacts a list", lambda m: m.update(artifacts=["result/model.bin"]), "lists no files"),
    ("no artifacts", lambda m: m.pop("artifacts"), "lists no files"),
    ("size as string", lambda m: m["artifacts"]["result/model.bin"].update(size="16384"), "size: int"),
    ("size as bool", lambda m: m["artifacts"]["result/metrics.json"].update(size=True), "size: int"),
    ("size as float", lambda m: m["artifacts"]["result/model.bin"].update(size=16384.0), "size: int"),
    ("sha256 missing", lambda m: m["artifacts"]["result/model.bin"].pop("sha256"), "sha256: str"),
    ("sha256 as int", lambda m: m["artifacts"]["result/model.bin"].update(sha256=0), "sha256: str"),
    ("entry not a dict", lambda m: m["artifacts"].update({"result/model.bin": 16384}), "result/model.bin"),
    ("wrong sha256", lambda m: m["artifacts"]["result/model.bin"].update(sha256="0" * 64), "sha256 mismatch"),
    ("wrong size", lambda m: m["artifacts"]["result/model.bin"].update(size=1), "size"),
]


@pytest.mark.parametrize("what,mutate,needle", WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_marker_with_wrong_field_types_is_corrupt_with_a_reason(tmp_path, what, mutate, needle):
    make_finished_run(tmp_path)
    rewrite_marker(tmp_path, mutate)
    assert_corrupt(tmp_path, needle)


@pytest.mark.parametrize("doc", ["[]", '"done"', "null", "1", "true", '[{"schema": 1}]'])
def test_marker_that_is_not_a_json_object_is_corrupt(tmp_path, doc):
    make_finished_run(tmp_path)
    (tmp_path / "done.json").write_text(doc)
    assert_corrupt(tmp_path, "not a JSON object")


def test_huge_marker_is_refused_unparsed(tmp_path):
    make_finished_run(tmp_path)
    m = json.loads((tmp_path / "done.json").read_text())
    m["padding"] = "x" * (protocol.MAX_JSON_BYTES + 10)
    (tmp_path / "done.json").write_text(json.dumps(m))
    assert_corrupt(tmp_path, "larger than")


@pytest.mark.parametrize("raw", [b"[" * 200_000, b"\xff\xfe{}", b"{\"schema\": 1,", b"",
                                 b'{"schema": NaN}'])
def test_hostile_marker_bytes_are_corrupt_and_never_raise(tmp_path, raw):
    make_finished_run(tmp_path)
    (tmp_path / "done.json").write_bytes(raw)
    assert protocol.verify_done_marker(tmp_path).status is MarkerStatus.CORRUPT


def test_write_done_marker_refuses_escaping_symlinked_missing_and_empty_artifacts(tmp_path):
    run = tmp_path / "run"
    make_finished_run(run)
    (tmp_path / "outside").write_text("x")
    os.symlink(run / "result" / "model.bin", run / "result" / "link.bin")
    with pytest.raises(UnsafePath, match="leaves the run dir"):
        protocol.write_done_marker(run, "j", 1, ["../outside"])
    with pytest.raises(UnsafePath, match="leaves the run dir"):
        protocol.write_done_marker(run, "j", 1, [str(tmp_path / "outside")])
    with pytest.raises(UnsafePath, match="symlink"):
        protocol.write_done_marker(run, "j", 1, ["result/link.bin"])
    with pytest.raises(FileNotFoundError, match="result/nope"):
        protocol.write_done_marker(run, "j", 1, ["result/nope"])
    with pytest.raises(ValueError, match="at least one artifact"):
        protocol.write_done_marker(run, "j", 1, [])
    # None of the refused writes replaced the good marker.
    assert protocol.verify_done_marker(run).marker["job"] == "job1"
    assert not [p for p in run.iterdir() if protocol.TMP_INFIX in p.name]


# =========================================================================================
# crash injection: kill the writer between every step of finishing a run
# =========================================================================================
CRASH_CHILD = textwrap.dedent("""
    import builtins, json, os, sys
    from pathlib import Path
    from orchestrator import protocol

    run_dir, k, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    calls = []

    def step(name, fn):
        def wrapped(*a, **kw):
            calls.append(name)
            me = len(calls)  # nested steps (fsync inside fsync_dir) count after this one
            if me == k and mode == "before":
                os._exit(77)
            r = fn(*a, **kw)
            if me == k and mode == "after":
                os._exit(77)
            return r
        return wrapped

    # Every durability step of the write: opening a file, fsync, rename, directory fsync.
    os.fsync = step("fsync", os.fsync)
    os.replace = step("replace", os.replace)
    # Module globals shadow the builtin / the import in each protocol module that writes.
    opener, fsync_dir = step("open", builtins.open), step("fsync_dir", protocol.fsync_dir)
    for mod in (protocol.durable, protocol.marker, protocol.progress, protocol.restarts):
        mod.open = opener
        mod.fsync_dir = fsync_dir

    # What a finishing job does: write its results atomically, then the marker as the last step.
    (run_dir / "result").mkdir(parents=True, exist_ok=True)
    protocol.atomic_write(run_dir / "result" / "model.bin", bytes(range(256)) * 4096)
    protocol.atomic_write(run_dir / "result" / "metrics.json", b'{"loss": 1.0}')
    protocol.write_done_marker(run_dir, "crashy", 1, ["result/model.bin", "result/metrics.json"])
    print(json.dumps(calls))
""")
FULL_MODEL = bytes(range(256)) * 4096


def _run_crash_child(run_dir: Path, k: int, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CRASH_CHILD, str(run_dir), str(k), mode], capture_output=True,
                          text=True, timeout=60, cwd=str(ROOT),
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_killing_the_writer_at_any_step_never_leaves_a_marker_that_lies(tmp_path):
    clean = _run_crash_child(tmp_path / "clean", 0, "none")
    assert clean.returncode == 0, clean.stderr
    steps = json.loads(clean.stdout)
    assert steps.count("replace") == 3 and "fsync_dir" in steps  # the instrumentation sees the write
    assert protocol.verify_done_marker(tmp_path / "clean").verified

    seen = set()
    for mode in ("before", "after"):
        for k in range(1, len(steps) + 1):
            run = tmp_path / f"{mode}-{k}"
            p = _run_crash_child(run, k, mode)
            assert p.returncode == 77, (mode, k, p.returncode, p.stderr)
            v = protocol.verify_done_marker(run)
            seen.add(v.status)
            # A reader sees no marker or a true one; never a partial/corrupt marker.
            assert v.status in (MarkerStatus.ABSENT, MarkerStatus.VERIFIED), (mode, k, steps[k - 1], v)
            if v.verified:
                assert (run / "result" / "model.bin").read_bytes() == FULL_MODEL
                assert (run / "result" / "metrics.json").read_bytes() == b'{"loss": 1.0}'
            # Final names only ever hold complete content; partial bytes live under tmp names.
            model = run / "result" / "model.bin"
            if model.exists():
                assert model.read_bytes() == FULL_MODEL, (mode, k)
            if (run / "done.json").exists():
                assert v.verified, (mode, k, v)
    # The sweep covered both sides: crashes before the marker rename, and after it.
    assert seen == {MarkerStatus.ABSENT, MarkerStatus.VERIFIED}
    # Killed after the last step: the write completed and verifies.
    assert protocol.verify_done_marker(tmp_path / f"after-{len(steps)}").verified


# =========================================================================================
# atomic_write
# =========================================================================================
def _tmp_leftovers(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if protocol.TMP_INFIX in p.name]


def test_atomic_write_replaces_content_and_leaves_no_tmp_file(tmp_path):
    p = tmp_path / "f.json"
    protocol.atomic_write(p, "old")
    protocol.atomic_write_json(p, {"a": 1})
    assert json.loads(p.read_text()) == {"a": 1}
    assert _tmp_leftovers(tmp_path) == []


def test_atomic_write_failing_at_rename_keeps_old_content_and_removes_the_tmp_file(tmp_path, monkeypatch):
    p = tmp_path / "f.txt"
    p.write_text("old")

    def boom(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        protocol.atomic_write(p, "new")
    assert p.read_text() == "old"
    assert _tmp_leftovers(tmp_path) == []


def test_atomic_write_failing_at_fsync_keeps_old_content_and_removes_the_tmp_file(tmp_path, monkeypatch):
    p = tmp_path / "f.txt"
    p.write_text("old")

    def boom(_fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="Input/output"):
        protocol.atomic_write(p, "new")
    assert p.read_text() == "old"
    assert _tmp_leftovers(tmp_path) == []


def test_write_file_synced_failing_midway_removes_the_partial_file(tmp_path):
    p = tmp_path / "part.bin"

    def chunks():
        yield b"a" * 1000
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError, match="producer died"):
        protocol.write_file_synced(p, chunks())
    assert not p.exists()


# =========================================================================================
# checkpoints
# =========================================================================================


def test_committed_checkpoints_verify_and_are_listed_newest_first(tmp_path):
    for s in (10, 30, 20):
        make_checkpoint(tmp_path, s)
    assert [s for s, _ in protocol.verified_checkpoints(tmp_path)] == [30, 20, 10]
    assert protocol.verify_checkpoint(tmp_path / "checkpoints" / "step-00000020") is None


def test_checkpoint_under_a_tmp_name_is_never_a_committed_one(tmp_path):
    good = make_checkpoint(tmp_path, 10)
    tmp = tmp_path / "checkpoints" / "step-00000020.tmp-1a2b3c4d"
    make_checkpoint(tmp_path, 20, final_name=tmp.name)  # complete and with a valid manifest, but not renamed
    short = make_checkpoint(tmp_path, 30, final_name="step-30")
    assert protocol.verified_checkpoints(tmp_path) == [(10, good)]
    assert "not a committed checkpoint name" in protocol.verify_checkpoint(tmp)
    assert "not a committed checkpoint name" in protocol.verify_checkpoint(short)


def test_checkpoint_without_manifest_is_not_verified(tmp_path):
    p = make_checkpoint(tmp_path, 10)
    (p / protocol.MANIFEST).unlink()
    assert protocol.verify_checkpoint(p) == "step-00000010 has no manifest.json"
    assert protocol.verified_checkpoints(tmp_path) == []


def test_checkpoint_whose_manifest_names_another_step_is_not_verified(tmp_path):
    p = make_checkpoint(tmp_path, 10)
    os.rename(p, tmp_path / "checkpoints" / "step-00000020")  # e.g. copied under the wrong name
    reason = protocol.verify_checkpoint(tmp_path / "checkpoints" / "step-00000020")
    assert reason is not None and "manifest step 10 != 20" in reason
    assert protocol.verified_checkpoints(tmp_path) == []


def test_checkpoint_with_a_corrupt_file_is_not_verified(tmp_path):
    keep = make_checkpoint(tmp_path, 10)
    bad = make_checkpoint(tmp_path, 20)
    data = bytearray((bad / "model.pt").read_bytes())
    data[0] ^= 0xFF
    (bad / "model.pt").write_bytes(bytes(data))
    assert "model.pt sha256 mismatch" in protocol.verify_checkpoint(bad)
    assert protocol.verified_checkpoints(tmp_path) == [(10, keep)]
    # The cheap mode (sizes only) still catches a truncated file.
    os.truncate(bad / "opt.pt", 3)
    assert "opt.pt has size 3" in protocol.verify_checkpoint(bad, hashes=False)


def test_checkpoint_with_unparsable_manifest_or_symlinked_dir_is_not_verified(tmp_path):
    p = make_checkpoint(tmp_path, 10)
    (p / protocol.MANIFEST).write_text('{"step": 10, "files": ')
    assert "not valid JSON" in protocol.verify_checkpoint(p)
    other = make_checkpoint(tmp_path / "other", 20)
    os.symlink(other, tmp_path / "checkpoints" / "step-00000020")
    assert "not a directory" in protocol.verify_checkpoint(tmp_path / "checkpoints" / "step-00000020")
    assert protocol.verified_checkpoints(tmp_path) == []


# =========================================================================================
# failure reports
# =========================================================================================
def _failure_path(run_dir: Path) -> Path:
    d = protocol.attempt_dir(run_dir, 1)
    d.mkdir(parents=True, exist_ok=True)
    return d / protocol.FAILURE_FILE


def test_write_failure_then_read_failure_round_trips(tmp_path):
    protocol.write_failure(tmp_path, 1, "nan", 412, "loss is nan", lr=0.1)
    r = protocol.read_failure(tmp_path, 1)
    assert (r["class"], r["step"], r["detail"], r["lr"]) == ("nan", 412, "loss is nan", 0.1)
    with pytest.raises(ValueError, match="unknown failure class"):
        protocol.write_failure(tmp_path, 1, "bogus", None, "")


HOSTILE_REPORTS = [
    b"", b"not json", b"[]", b"null", b'"crash"', b'{"step": 3}', b'{"class": "bogus"}',
    b'{"class": ["crash"]}', b'{"class": {"crash": 1}}', b'{"class": null}', b"[" * 100_000,
    b"\xff\xfe\x00", b'{"class": "crash", "detail": "' + b"x" * (300 * 1024) + b'"}',
]


@pytest.mark.parametrize("raw", HOSTILE_REPORTS, ids=range(len(HOSTILE_REPORTS)))
def test_read_failure_treats_hostile_reports_as_absent(tmp_path, raw):
    _failure_path(tmp_path).write_bytes(raw)
    assert protocol.read_failure(tmp_path, 1) is None


@pytest.mark.parametrize("step", ['"412"', "true", "4.5", "[1]", "-1", str(10**30)])
def test_read_failure_drops_a_step_of_the_wrong_type(tmp_path, step):
    _failure_path(tmp_path).write_text(f'{{"class": "nan", "step": {step}}}')
    r = protocol.read_failure(tmp_path, 1)
    assert r["class"] == "nan" and r["step"] is None


def test_read_failure_ignores_a_symlinked_report_and_a_missing_one(tmp_path):
    real = tmp_path / "elsewhere.json"
    real.write_text('{"class": "oom", "step": 1}')
    os.symlink(real, _failure_path(tmp_path))
    assert protocol.read_failure(tmp_path, 1) is None
    assert protocol.read_failure(tmp_path, 2) is None


# =========================================================================================
# job names
# =========================================================================================
@pytest.mark.parametrize("name", ["a", "job-1", "Run_2.v3", "x" * 128, "0abc", "a.b-c_d"])
def test_validate_job_name_accepts_plain_names(name):
    assert protocol.validate_job_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "a..b", "../x", "a/b", "/abs", "-flag", ".hidden", "_x",
                                  "x" * 129, "a b", "a\nb", "abc\n", "abc\r", "a\x00b", "ä", "a#SBATCH",
                                  "a;rm", "a\\b", 123, None])
def test_validate_job_name_refuses_path_tricks_and_newlines(name):
    with pytest.raises(UnsafePath, match="invalid job name"):
        protocol.validate_job_name(name)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.text(max_size=140),
                      st.text(alphabet="ab./\n\r\x00-_ \\", max_size=12),
                      st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}\n?", fullmatch=True)))
def test_accepted_names_never_escape_the_runs_root(tmp_path, name):
    try:
        protocol.validate_job_name(name)
    except UnsafePath:
        return
    assert "/" not in name and ".." not in name and "\x00" not in name
    assert not any(c in name for c in "\n\r\t ")
    root = tmp_path.resolve()
    resolved = (root / name).resolve()
    assert resolved.parent == root and resolved.name == name


def test_restart_history_reads_what_each_in_place_restart_set_aside(tmp_path: Path) -> None:
    # A Slurm in-place requeue reruns attempt 1 twice: the trainer sets its earlier failure.json aside and the
    # wrapper its exit.json; `orch show` turns them into "restarts=2 (preempted at step 1358, timeout)".
    d = protocol.attempt_dir(tmp_path, 1)
    protocol.write_failure(tmp_path, 1, "preempted", 1358, "SIGTERM during step 1359")
    protocol.write_exit(d, protocol.ExitRecord(token="t1", returncode=143, stop_signal="SIGTERM", stop_source="signal"))
    assert protocol.set_aside(d / protocol.FAILURE_FILE).name == "failure.prev-1.json"
    assert protocol.set_aside(d / protocol.EXIT_FILE).name == "exit.prev-1.json"
    # The second run wrote no failure.json (a program that does not classify itself): the exit record decides.
    protocol.write_exit(d, protocol.ExitRecord(token="t1", returncode=0, time_limit_reached=True))
    protocol.set_aside(d / protocol.EXIT_FILE)
    (d / "failure.prev-3.json").write_text('{"class": "preempted", "step": ')  # torn by a kill: unknown
    assert protocol.restart_history(tmp_path, 1, "t1") == [
        {"restart": 1, "class": "preempted", "step": 1358},
        {"restart": 2, "class": "timeout", "step": None},
        {"restart": 3, "class": "unknown", "step": None},
    ]
    # Another attempt's exit record (a reused run dir) says nothing about this one.
    assert protocol.restart_history(tmp_path, 1, "other")[1] == {"restart": 2, "class": "unknown", "step": None}


def test_show_names_each_restart_with_its_class_and_step() -> None:
    from orchestrator.cli.read import _restarts_note

    history = [{"restart": 1, "class": "preempted", "step": 1358}, {"restart": 2, "class": "timeout", "step": None}]
    assert _restarts_note(history) == " (preempted at step 1358, timeout)"
    assert _restarts_note([]) == ""


def test_the_done_marker_fsyncs_every_artifact_its_dirs_the_marker_tmp_and_the_run_dir_in_order(tmp_path,
                                                                                              monkeypatch):
    """Mutation discipline: removing any one fsync of write_done_marker left every test passing.
    A recording shim around os.fsync/os.replace sees which path is made durable at which commit point:
    (1) each artifact's bytes and (2) its directory entry before the marker exists, (3) the marker's tmp
    file before its rename, (4) the run dir after the rename (the marker's own directory entry)."""
    run = tmp_path / "run"
    (run / "result" / "sub").mkdir(parents=True)
    (run / "result" / "a.bin").write_bytes(b"a" * 100)
    (run / "result" / "sub" / "b.bin").write_bytes(b"b" * 100)
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst, **kw):
        events.append(("replace", f"{src} -> {dst}"))
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    protocol.write_done_marker(run, "j", 1, ["result/sub/b.bin", "result/a.bin"])
    monkeypatch.undo()
    assert protocol.verify_done_marker(run).verified

    def at(kind: str, pred) -> int:
        hits = [i for i, (k, what) in enumerate(events) if k == kind and pred(what)]
        assert len(hits) == 1, (kind, events)
        return hits[0]

    rename = at("replace", lambda w: w.endswith(f" -> {run / protocol.DONE_MARKER}"))
    tmp = at("fsync", lambda w: Path(w).name.startswith(f"{protocol.DONE_MARKER}.tmp-"))
    for artifact in ("result/a.bin", "result/sub/b.bin"):
        assert at("fsync", lambda w, a=artifact: w == str(run / a)) < tmp, (artifact, events)
    for d in ("result", "result/sub"):
        assert at("fsync", lambda w, d=d: w == str(run / d)) < tmp, (d, events)
    assert tmp < rename < at("fsync", lambda w: w == str(run)), events


def _preempted_run_set_aside(run_dir: Path, token: str = "t1") -> Path:
    """Attempt 1's first run stopped by a TERM (the program wrote class preempted) and rerun in place."""
    d = protocol.attempt_dir(run_dir, 1)
    protocol.write_failure(run_dir, 1, "preempted", 40, "SIGTERM during step 41")
    protocol.write_exit(d, protocol.ExitRecord(token=token, returncode=143, stop_signal="SIGTERM",
                                               stop_source="signal"))
    protocol.set_aside(d / protocol.FAILURE_FILE)
    protocol.set_aside(d / protocol.EXIT_FILE)
    return d


def test_the_schedulers_cause_of_an_in_place_restart_wins_over_the_programs_guess(tmp_path: Path) -> None:
    # Seen on the dev cluster (tests/slurm/test_node_fail_and_oom.py): a node set down under the job; Slurm said
    # NODE_FAIL and reran it in place, the program saw only a TERM and wrote "preempted". The scheduler's word wins;
    # the step the program reported stays.
    d = _preempted_run_set_aside(tmp_path)
    assert protocol.restart_history(tmp_path, 1, "t1") == [{"restart": 1, "class": "preempted", "step": 40}]
    assert protocol.write_restart_causes(d, "t1", ["node_fail"])
    assert protocol.restart_history(tmp_path, 1, "t1") == [{"restart": 1, "class": "node_fail", "step": 40}]


@pytest.mark.parametrize("causes", [["preempted"], [None], []])
def test_a_scheduler_preemption_or_no_cause_leaves_the_in_place_restart_preempted(tmp_path: Path, causes) -> None:
    d = _preempted_run_set_aside(tmp_path)
    protocol.write_restart_causes(d, "t1", causes)
    assert protocol.restart_history(tmp_path, 1, "t1") == [{"restart": 1, "class": "preempted", "step": 40}]


@pytest.mark.parametrize("body", [
    '{"token": "other", "causes": ["node_fail"]}',  # another attempt's (a run dir reused under a fresh DB)
    '{"token": "t1", "causes": ["not-a-class"]}',  # the job can write the run dir: only known classes count
    '{"token": "t1", "causes": "node_fail"}', '{"token": "t1", "causes": [', "[]",
])
def test_a_foreign_or_bad_scheduler_record_is_no_cause(tmp_path: Path, body: str) -> None:
    d = _preempted_run_set_aside(tmp_path)
    (d / protocol.RESTART_CAUSES_FILE).write_text(body)
    assert protocol.restart_history(tmp_path, 1, "t1") == [{"restart": 1, "class": "preempted", "step": 40}]


def test_a_restart_that_left_no_records_takes_the_schedulers_cause(tmp_path: Path) -> None:
    # A failed node takes the wrapper with it: no exit.json to set aside, only Slurm knows why the run ended.
    d = protocol.attempt_dir(tmp_path, 1)
    protocol.write_restart_causes(d, "t1", ["node_fail", None])
    assert protocol.restart_history(tmp_path, 1, "t1") == [{"restart": 1, "class": "node_fail", "step": None}]


def test_a_poll_that_knows_less_never_erases_a_recorded_cause(tmp_path: Path) -> None:
    d = protocol.attempt_dir(tmp_path, 1)
    assert protocol.write_restart_causes(d, "t1", ["node_fail"])
    assert not protocol.write_restart_causes(d, "t1", [])  # shorter: e.g. sacct lost its earlier record
    assert not protocol.write_restart_causes(d, "t1", [None])
    assert protocol.write_restart_causes(d, "t1", [None, "preempted"])
    assert protocol.read_restart_causes(d, "t1") == ["node_fail", "preempted"]
