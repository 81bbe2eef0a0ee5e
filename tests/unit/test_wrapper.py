"""orchestrator.jobside.wrapper, run as the backends run it: it records how the program ended (exit.json) and writes the
done marker only after the program completed and exited 0 (the one predicate). The stop paths end to end:
tests/local/test_wrapper_completion.py, tests/local/test_wrapper_guard.py."""

from __future__ import annotations

import subprocess
import sys

from orchestrator import protocol


def _wrap(run_dir, *command: str) -> subprocess.CompletedProcess:
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "orchestrator.jobside.wrapper", "--run-dir", str(run_dir),
                           "--job", "w", "--attempt", "1", "--token", "tok1", "--outputs", "out.txt", "--", *command],
                          capture_output=True, text=True, timeout=60, cwd=run_dir)


def test_a_program_that_exits_0_with_its_outputs_gets_a_verified_marker(tmp_path):
    p = _wrap(tmp_path / "ok", "sh", "-c", "echo result > out.txt")
    assert p.returncode == 0, p.stderr
    rec = protocol.read_exit(protocol.attempt_dir(tmp_path / "ok", 1), "tok1")
    assert rec is not None and rec.returncode == 0 and rec.stop_signal is None
    assert protocol.verify_done_marker(tmp_path / "ok").verified


def test_a_program_that_fails_after_writing_its_outputs_gets_no_marker(tmp_path):
    p = _wrap(tmp_path / "bad", "sh", "-c", "echo result > out.txt; exit 3")
    assert p.returncode == 3
    rec = protocol.read_exit(protocol.attempt_dir(tmp_path / "bad", 1), "tok1")
    assert rec.returncode == 3 and rec.marker_error == "not written: the program exited 3", rec
    assert not protocol.verify_done_marker(tmp_path / "bad").verified


def test_a_done_marker_the_program_wrote_itself_is_set_aside_when_it_then_fails(tmp_path):
    """The backstop behind the refusal: a program (or its framework) that wrote a valid done.json and then
    exited non-zero never leaves it verifiable."""
    write_own = (f"import sys; sys.path.insert(0, {str(protocol.__file__.rsplit('/orchestrator/', 1)[0])!r}); "
                 "from orchestrator import protocol; open('out.txt', 'w').write('r'); "
                 "protocol.write_done_marker('.', 'w', 1, ['out.txt']); sys.exit(3)")
    p = _wrap(tmp_path / "own", sys.executable, "-c", write_own)
    assert p.returncode == 3, p.stderr
    rec = protocol.read_exit(protocol.attempt_dir(tmp_path / "own", 1), "tok1")
    assert rec.marker_set_aside and not protocol.verify_done_marker(tmp_path / "own").verified, rec


def test_a_program_killed_by_a_signal_is_recorded_as_that_signal_and_gets_no_marker(tmp_path):
    p = _wrap(tmp_path / "sig", "sh", "-c", "echo result > out.txt; kill -9 $$")
    assert p.returncode == 128 + 9
    assert protocol.read_exit(protocol.attempt_dir(tmp_path / "sig", 1), "tok1").returncode == -9
    assert not protocol.verify_done_marker(tmp_path / "sig").verified
