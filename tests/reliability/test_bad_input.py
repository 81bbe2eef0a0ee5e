"""R4: hostile and malformed input gets a clear one-line error, the documented exit code, no
traceback, and changes no file.

Inputs: job names, --mem / --time / --outputs / --sbatch-arg strings, orch.toml, done.json and
failure.json (huge, deeply nested, wrong types, artifact paths that leave the run dir, symlinked
artifacts). Most cases run in-process through click's CliRunner (milliseconds each, so hypothesis can
try many); ``test_cli_subprocess_sample`` runs a sample through the real ``orch`` entry point.

Exit codes asserted (design.md, ``orchestrator/cli/``): 2 for every argument or orch.toml problem
(found before ORCH_HOME, a row or a directory exists), 3 for a refusal (a symlinked run dir, a
verified run), 4 for ``orch verify`` of a marker that does not verify (the CLI's documented
"not verified" code; it prints ``CORRUPT: reason``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from relkit import LONG, ROOT, sentinel, tree_hash

from orchestrator import protocol
from orchestrator.backends.base import AttemptRef, Backend, Outcome, Phase, SubmitSpec
from orchestrator.cli import main
from orchestrator.cli.args import parse_mem_mb, parse_time_s
from orchestrator.core.config import load_config
from orchestrator.core.db import Database
from orchestrator.errors import UsageError

EXAMPLES = 400 if LONG else 40
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.filter_too_much])
ERROR_LINE = re.compile(r"^(Error: |orch: )")


@contextmanager
def home_env(home: Path, db_url: str | None = None) -> Iterator[Path]:
    old = {k: os.environ.get(k) for k in ("ORCH_HOME", "ORCH_DB_URL")}
    os.environ["ORCH_HOME"] = str(home)
    if db_url:
        os.environ["ORCH_DB_URL"] = db_url
    else:
        os.environ.pop("ORCH_DB_URL", None)
    try:
        yield home
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="orch")


def assert_one_line_error(res: Result, code: int, *needles: str) -> str:
    """Exit ``code``, exactly one error line (containing each needle), no traceback, no stray exception."""
    err = res.stderr
    assert res.exit_code == code, f"exit {res.exit_code}, wanted {code}: {res.output!r} {res.exception!r}"
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output, res.output
    lines = [ln for ln in err.splitlines() if ERROR_LINE.match(ln)]
    assert len(lines) == 1, f"wanted one error line: {err!r}"
    for n in needles:
        assert n.lower() in lines[0].lower(), f"{n!r} not in {lines[0]!r}"
    return lines[0]


def _valid_name(n: str) -> bool:
    try:
        protocol.validate_job_name(n)
        return True
    except protocol.UnsafePath:
        return False


HOSTILE_NAMES = ["", ".", "..", "../x", "a/b", "/etc", "x/../../etc", "a\nb", "job\n#SBATCH --uid=0", "-rf",
                 ".hidden", "a" * 129, "ａｂｃ", "a b", "a;rm -rf ~", "$(id)", "a\x00b", "café", "name\t", "x..y",
                 "a\\b", "~root"]


# =================================================================================================
# arguments
# =================================================================================================
@SETTINGS
@given(name=st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(max_size=140)).filter(lambda n: not _valid_name(n)))
def test_hostile_job_names_exit_2_before_anything_exists(tmp_path: Path, name: str) -> None:
    with home_env(Path(tempfile.mkdtemp(dir=tmp_path)) / "home") as home:
        res = invoke("submit", f"--name={name}", "--", "true")
        assert_one_line_error(res, 2, "--name")
        assert not home.exists(), "ORCH_HOME was created for a refused argument"


def _mem_invalid(v: str) -> bool:
    try:
        parse_mem_mb(v)
        return False
    except Exception:  # click.BadParameter
        return True


def _time_invalid(v: str) -> bool:
    try:
        parse_time_s(v)
        return False
    except Exception:
        return True


@SETTINGS
@given(mem=st.one_of(st.sampled_from(["0", "-1G", "1.5G", "4GB\n#SBATCH --x", "G", "1X", "", " ", "0M", "1e9",
                                      "9" * 400 + "K", "9300000000000000000", "99999999999T"]),
                     st.text(max_size=30)).filter(_mem_invalid))
def test_bad_mem_strings_exit_2_naming_the_option(tmp_path: Path, mem: str) -> None:
    with home_env(Path(tempfile.mkdtemp(dir=tmp_path)) / "home") as home:
        res = invoke("submit", "--name", "ok", f"--mem={mem}", "--", "true")
        assert_one_line_error(res, 2, "--mem")
        assert not home.exists()


@SETTINGS
@given(t=st.one_of(st.sampled_from(["0", "0:00", "1:60", "1:00:60", "-1", "1-25:00:00x", "1--1", "::", "",
                                    "1:2:3:4", "12h", "1-", "9" * 30, "99999999999-00"]),
                 st.text(max_size=20)).filter(_time_invalid))
def test_bad_time_strings_exit_2_naming_the_option(tmp_path: Path, t: str) -> None:
    with home_env(Path(tempfile.mkdtemp(dir=tmp_path)) / "home") as home:
        res = invoke("submit", "--name", "ok", f"--time={t}", "--", "true")
        assert_one_line_error(res, 2, "--time")
        assert not home.exists()


@SETTINGS
@given(mem=st.from_regex(r"\A[0-9]{1,400}[KMGTkmgt]?[Bb]?\Z"), t=st.from_regex(
    r"\A([0-9]{1,40}-)?[0-9]{1,40}(:[0-9]{1,2}){0,2}\Z"))
def test_mem_and_time_that_parse_are_sane(mem: str, t: str) -> None:
    """What the parsers accept is a positive value a scheduler can take (no overflow further on)."""
    for parse, v, cap in ((parse_mem_mb, mem, 2**63 - 1), (parse_time_s, t, 2**63 - 1)):
        try:
            got = parse(v)
        except Exception as e:
            assert type(e).__name__ == "BadParameter", repr(e)
            continue
        assert isinstance(got, int) and 0 < got <= cap, (v, got)


@pytest.mark.parametrize("args, needle", [
    (["--outputs", "../x"], "--outputs"), (["--outputs", "/etc/*"], "--outputs"),
    (["--outputs", "a/../../b"], "--outputs"), (["--outputs", ""], "--outputs"),
    (["--outputs", "a\nb"], "--outputs"),
    (["--backend", "slurm", "--partition", "gpu\n#SBATCH --uid=0"], "--partition"),
    (["--backend", "slurm", "--account", "a b"], "--account"),
    (["--backend", "slurm", "--sbatch-arg", "--qos=high\n#SBATCH --x"], "--sbatch-arg"),
    (["--backend", "slurm", "--sbatch-arg", "-x"], "--sbatch-arg"),
    (["--partition", "p"], "--backend slurm"),
    (["--gpus", "-1"], "--gpus"), (["--cpus-per-task", "0"], "--cpus-per-task"),
    (["--max-attempts", "0"], "--max-attempts"), (["--backend", "k8s"], "--backend"),
])
def test_bad_submit_options_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    with home_env(tmp_path / "home") as home:
        res = invoke("submit", "--name", "ok", *args, "--", "true")
        assert_one_line_error(res, 2, needle)
        assert not home.exists()


@pytest.mark.parametrize("target, needle", [
    ("/nonexistent/run", "not a directory"), ("./no/such/dir", "not a directory"), ("..", None),
    ("a/../..", None), ("a/../../b", "not a directory"), ("-", "no job"), ("-rf", "no such option"),
    ("x" * 5000 + "/", "not a directory"),
])
def test_verify_of_odd_paths_exits_2_or_4_and_writes_nothing(tmp_path: Path, target: str, needle: str | None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A path that is not a directory is a usage error (2); a real directory without a marker is ABSENT (4)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    with home_env(tmp_path / "home") as home:
        res = invoke("verify", target)
    if needle is None:  # an existing directory: answered, not refused
        assert res.exit_code == 4 and res.output.startswith("ABSENT: "), res.output
    else:
        assert_one_line_error(res, 2, needle)
    if not target.startswith("-"):  # a name (not a path) is looked up in the DB, which creates it
        assert not home.exists()


@pytest.mark.parametrize("cmd", [["show", "nope"], ["logs", "nope"], ["requeue", "nope"], ["cancel", "nope"]])
def test_unknown_job_exits_2_and_writes_no_run_dir(tmp_path: Path, cmd: list[str]) -> None:
    with home_env(tmp_path / "home") as home:
        res = invoke(*cmd)
        assert_one_line_error(res, 2, "nope")
        assert not (home / "runs" / "nope").exists()


# =================================================================================================
# orch.toml
# =================================================================================================
KEYS = {"runs": ["root"], "policy": ["auto_requeue", "uncounted", "caps", "max_attempts", "nan_rollback_steps",
                                     "nan_lr_factor", "oom_mem_factor", "oom_mem_cap_mb", "crash_backoff_s",
                                     "hang_timeout_s", "slow_factor", "keep_last_k"],
        "reconcile": ["lease_ttl_s", "busy_timeout_ms"]}


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, (int, str)):
        return json.dumps(v) if isinstance(v, str) else str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


TOML_VALUES = st.recursive(
    st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True), st.text(max_size=12),
              st.sampled_from(["oom", "nan", "preempted", "bogus", "/abs/path", "relative/path"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["oom", "nan", "x"]),
                                                                         inner, max_size=2)),
    max_leaves=5)


@st.composite
def orch_tomls(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return draw(st.text(max_size=200))  # mostly not TOML at all
    out = []
    for table, keys in KEYS.items():
        chosen = draw(st.lists(st.sampled_from(keys), unique=True, max_size=3))
        if chosen or draw(st.booleans()):
            out.append(f"[{table}]")
            out += [f"{k} = {_toml_value(draw(TOML_VALUES))}" for k in chosen]
    return "\n".join(out) + "\n"


def _sane(cfg: object) -> list[str]:
    """Problems of an ACCEPTED config: what would later crash a pass or silently disable a safeguard."""
    bad = []
    for k in ("max_attempts", "nan_rollback_steps", "nan_lr_factor", "oom_mem_factor", "oom_mem_cap_mb",
              "crash_backoff_s", "hang_timeout_s", "slow_factor", "keep_last_k", "lease_ttl_s", "busy_timeout_ms"):
        v = getattr(cfg, k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            bad.append(f"{k}={v!r}")
    return bad


@SETTINGS
@example(toml="[policy]\nhang_timeout_s = nan\n")
@example(toml="[policy]\ncrash_backoff_s = inf\n")
@example(toml="[reconcile]\nbusy_timeout_ms = -5\n")
@example(toml="[reconcile]\nlease_ttl_s = -1.0\n")
@example(toml="[runs]\nroot = \"relative\"\n")
@example(toml="runs = 3\n")
@example(toml="[policy]\ncaps = {oom = -1}\n")
@example(toml="\x00\xff garbage [[[")
@given(toml=orch_tomls())
def test_malformed_orch_toml_exits_2_naming_the_file_and_writes_nothing(tmp_path: Path, toml: str) -> None:
    home = Path(tempfile.mkdtemp(dir=tmp_path)) / "home"
    home.mkdir()
    (home / "orch.toml").write_text(toml, errors="surrogateescape")
    before = tree_hash(home)
    try:
        cfg = load_config(home)
    except UsageError:
        cfg = None
    if cfg is not None:
        assert not _sane(cfg), f"orch.toml accepted with unusable values: {_sane(cfg)}"
        return  # a valid config: nothing to refuse
    with home_env(home):
        res = invoke("status")
    assert_one_line_error(res, 2, "orch.toml")
    assert tree_hash(home) == before, "a refused orch.toml still led to files being written"
    assert not (home / "orch.db").exists()


def test_orch_toml_that_is_a_directory_exits_2(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "orch.toml").mkdir(parents=True)
    with home_env(home):
        assert_one_line_error(invoke("status"), 2, "orch.toml")
    assert not (home / "orch.db").exists()


# =================================================================================================
# done.json
# =================================================================================================
MODEL = b"weights" * 100


def _run_dir(tmp_path: Path) -> tuple[Path, Path]:
    outside = sentinel(tmp_path)
    rd = tmp_path / "runs" / "job"
    (rd / "result").mkdir(parents=True)
    (rd / "result" / "model.pt").write_bytes(MODEL)
    return rd, outside


def _good_marker(rd: Path) -> dict:
    size, digest = protocol.sha256_file(rd / "result" / "model.pt")
    return {"schema": 1, "job": "job", "attempt": 1, "finished_at": "2026-11-29T00:00:00Z",
            "artifacts": {"result/model.pt": {"size": size, "sha256": digest}}}


def _hostile_markers(rd: Path, outside: Path) -> dict[str, object]:
    """name -> bytes to write as done.json, or a callable that sets the run dir up."""
    good = _good_marker(rd)
    secret = outside / "secret.txt"
    s_size, s_digest = protocol.sha256_file(secret)

    def with_artifacts(arts: object) -> bytes:
        return json.dumps({**good, "artifacts": arts}).encode()

    def symlinked_artifact() -> bytes:
        (rd / "result" / "stolen").symlink_to(secret)
        return with_artifacts({"result/stolen": {"size": s_size, "sha256": s_digest}})

    def symlinked_result_dir() -> bytes:
        (rd / "res2").symlink_to(outside)
        return with_artifacts({"res2/secret.txt": {"size": s_size, "sha256": s_digest}})

    def marker_is_symlink() -> None:
        (outside / "done.json").write_text(json.dumps(good))
        (rd / "done.json").symlink_to(outside / "done.json")

    def marker_is_dir() -> None:
        (rd / "done.json").mkdir()

    return {
        "huge": b'{"pad": "' + b"x" * (protocol.MAX_JSON_BYTES + 10) + b'"}',
        "deep nesting": b"[" * 200_000 + b"]" * 200_000,
        "deep objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        "not utf-8": b"\xff\xfe\x00{",
        "empty": b"",
        "a list": b"[1, 2, 3]",
        "schema 2": json.dumps({**good, "schema": 2}).encode(),
        "attempt as string": json.dumps({**good, "attempt": "1"}).encode(),
        "job null": json.dumps({**good, "job": None}).encode(),
        "artifacts list": with_artifacts(["result/model.pt"]),
        "artifacts empty": with_artifacts({}),
        "size as string": with_artifacts({"result/model.pt": {"size": str(len(MODEL)), "sha256": "0" * 64}}),
        "size bool": with_artifacts({"result/model.pt": {"size": True, "sha256": good["artifacts"]["result/model.pt"]
                                                         ["sha256"]}}),
        "size NaN": b'{"schema": 1, "job": "job", "attempt": 1, "artifacts": {"result/model.pt": {"size": NaN, '
                    b'"sha256": "00"}}}',
        "size 1e400": b'{"schema": 1, "job": "job", "attempt": 1, "artifacts": {"result/model.pt": {"size": 1e400, '
                      b'"sha256": "00"}}}',
        "size 10**400": ('{"schema": 1, "job": "job", "attempt": 1, "artifacts": {"result/model.pt": {"size": '
                         + "9" * 400 + ', "sha256": "00"}}}').encode(),
        "wrong hash": with_artifacts({"result/model.pt": {"size": len(MODEL), "sha256": "0" * 64}}),
        "../../etc/passwd": with_artifacts({"../../etc/passwd": {"size": 1, "sha256": "00"}}),
        "/etc/passwd": with_artifacts({"/etc/passwd": {"size": 1, "sha256": "00"}}),
        "result/../../outside": with_artifacts({"result/../../../outside/secret.txt": {"size": s_size,
                                                                                      "sha256": s_digest}}),
        "dot path": with_artifacts({"./result/model.pt": good["artifacts"]["result/model.pt"]}),
        "double slash": with_artifacts({"result//model.pt": good["artifacts"]["result/model.pt"]}),
        "NUL in path": with_artifacts({"result/model.pt\x00x": good["artifacts"]["result/model.pt"]}),
        "newline in path": with_artifacts({"result/x\nVERIFIED": good["artifacts"]["result/model.pt"]}),
        "backslash path": with_artifacts({"result\\..\\..\\x": {"size": 1, "sha256": "00"}}),
        "symlinked artifact": symlinked_artifact,
        "symlinked dir": symlinked_result_dir,
        "marker is a symlink": marker_is_symlink,
        "marker is a dir": marker_is_dir,
    }


MARKER_CASES = ["huge", "deep nesting", "deep objects", "not utf-8", "empty", "a list", "schema 2", "attempt as string",
                "job null", "artifacts list", "artifacts empty", "size as string", "size bool", "size NaN",
                "size 1e400", "size 10**400", "wrong hash", "../../etc/passwd", "/etc/passwd", "result/../../outside",
                "dot path", "double slash", "NUL in path", "newline in path", "backslash path", "symlinked artifact",
                "symlinked dir", "marker is a symlink", "marker is a dir"]


@pytest.mark.parametrize("case", MARKER_CASES)
def test_hostile_done_json_is_corrupt_never_verified_and_changes_nothing(tmp_path: Path, case: str) -> None:
    rd, outside = _run_dir(tmp_path)
    cases = _hostile_markers(rd, outside)
    assert sorted(cases) == sorted(MARKER_CASES)
    content = cases[case]
    content = content() if callable(content) else content
    if content is not None:
        (rd / "done.json").write_bytes(content)
    before_rd, before_out = tree_hash(rd), tree_hash(outside)
    with home_env(tmp_path / "home") as home:
        res = invoke("verify", str(rd))
    assert res.exit_code == 4, (res.exit_code, res.output)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    out = res.output.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("CORRUPT: "), out
    assert len(out[0]) < 400, "the reason must be one short line, not the hostile content"
    assert tree_hash(rd) == before_rd and tree_hash(outside) == before_out
    assert not home.exists()


JSONS = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(st.text(max_size=20), inner, max_size=4)),
                     max_leaves=20)


@st.composite
def markers(draw: st.DrawFn) -> dict:
    m = {"schema": draw(st.one_of(st.just(1), JSONS)), "job": draw(st.one_of(st.just("job"), JSONS)),
         "attempt": draw(st.one_of(st.just(1), JSONS))}
    arts = draw(st.one_of(JSONS, st.dictionaries(
        st.one_of(st.sampled_from(["result/model.pt", "../x", "/etc/passwd", "result/../../x", "result"]),
                  st.text(max_size=30)),
        st.one_of(JSONS, st.fixed_dictionaries({"size": st.one_of(st.integers(), JSONS), "sha256": JSONS})),
        max_size=3)))
    m["artifacts"] = arts
    return m


@SETTINGS
@given(marker=markers())
def test_generated_done_json_never_raises_and_verifies_only_if_true(tmp_path: Path, marker: dict) -> None:
    d = Path(tempfile.mkdtemp(dir=tmp_path))
    (d / "result").mkdir()
    (d / "result" / "model.pt").write_bytes(MODEL)
    (d / "done.json").write_text(json.dumps(marker))
    before = tree_hash(d)
    v = protocol.verify_done_marker(d)
    if v.verified:  # only possible if the listing is exactly right
        size, digest = protocol.sha256_file(d / "result" / "model.pt")
        assert marker["artifacts"] == {"result/model.pt": {"size": size, "sha256": digest}} or all(
            isinstance(m, dict) and m.get("size") == size and m.get("sha256") == digest
            for m in marker["artifacts"].values())
    else:
        assert v.status.value in ("CORRUPT", "ABSENT") and "\n" not in v.reason
    assert tree_hash(d) == before


# =================================================================================================
# failure.json
# =================================================================================================
FAILURES = st.one_of(
    JSONS,
    st.fixed_dictionaries({"class": st.one_of(st.sampled_from(list(protocol.FAILURE_CLASSES)), JSONS),
                           "step": st.one_of(st.integers(min_value=-2**200, max_value=2**200), JSONS),
                           "detail": st.one_of(st.text(max_size=5000), JSONS)},
                          optional={"lr": JSONS, "checkpoint": JSONS}))


@SETTINGS
@example(report={"class": "nan", "step": 10**30, "detail": "x"})
@example(report={"class": "nan", "step": -5, "detail": "x"})
@example(report={"class": "oom", "step": 2**63, "detail": "x"})
@given(report=FAILURES)
def test_generated_failure_json_reads_as_none_or_a_sane_report(tmp_path: Path, report: object) -> None:
    d = Path(tempfile.mkdtemp(dir=tmp_path))
    protocol.attempt_dir(d, 1).mkdir(parents=True)
    (protocol.attempt_dir(d, 1) / "failure.json").write_text(json.dumps(report))
    r = protocol.read_failure(d, 1)
    if r is not None:
        assert r["class"] in protocol.FAILURE_CLASSES
        step = r.get("step")
        # The step reaches the DB (attempts.failure_step, a 64-bit INTEGER) and the NaN rollback policy.
        assert step is None or (isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**63), step


class ExitedBackend(Backend):
    """Every attempt exited with ``code`` (the reconciler then reads the job's failure.json)."""

    name = "local"

    def __init__(self, code: int = 3) -> None:
        self.code = code

    def submit(self, spec: SubmitSpec) -> str:
        return f"fake-{spec.token}"

    def poll(self, refs: list[AttemptRef]) -> dict[str, Outcome]:
        return {r.token: Outcome(Phase.EXITED, exit_code=self.code) for r in refs}

    def cancel(self, refs: list[AttemptRef]) -> None:
        pass

    def find_by_token(self, refs: list[AttemptRef]) -> dict[str, str]:
        return {}


HOSTILE_FAILURES = {
    "huge step": b'{"class": "nan", "step": 1000000000000000000000000000000, "detail": "x"}',
    "step over 2**31": b'{"class": "nan", "step": 3000000000, "detail": "x"}',  # PostgreSQL's INTEGER is 32-bit
    "NUL in detail": b'{"class": "crash", "step": 1, "detail": "a\\u0000b"}',  # PostgreSQL text refuses NUL
    "negative step": b'{"class": "nan", "step": -5, "detail": "x"}',
    "step as string": b'{"class": "oom", "step": "12", "detail": "x"}',
    "unknown class": b'{"class": "rm -rf", "step": 1}',
    "huge detail": json.dumps({"class": "crash", "step": 1, "detail": "d" * 200_000}).encode(),
    "over 256 KiB": b'{"class": "crash", "pad": "' + b"x" * 300_000 + b'"}',
    "deep nesting": b'{"class": "crash", "detail": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "not json": b"\xff\xfe garbage",
    "a list": b'["crash"]',
    "lr NaN": b'{"class": "nan", "step": 3, "lr": NaN}',
}


# PostgreSQL refuses values SQLite stores (a step past its 32/64-bit INTEGER, a NUL in text): those cases run
# on both; the parsing cases are DB-independent and run on SQLite only (to save CI time).
ON_POSTGRES_TOO = ("huge step", "step over 2**31", "NUL in detail", "huge detail", "negative step", "lr NaN")


@pytest.mark.parametrize("db_kind, case", [("sqlite", c) for c in HOSTILE_FAILURES]
                         + [("postgres", c) for c in ON_POSTGRES_TOO],
                         ids=[f"sqlite-{c}" for c in HOSTILE_FAILURES] + [f"postgres-{c}" for c in ON_POSTGRES_TOO],
                         indirect=["db_kind"])
def test_reconcile_survives_a_hostile_failure_json(tmp_path: Path, case: str, clean_env: None,
                                                   monkeypatch: pytest.MonkeyPatch, db_url: str | None) -> None:
    """One job's report must never crash the pass (and with it every other job's reconciliation), on
    SQLite or PostgreSQL (each refuses other values: a 64-bit step, a NUL in text)."""
    import orchkit

    from orchestrator.ops.reconcile import reconcile_pass
    from orchestrator.ops.submit import SubmitRequest, submit

    outside = sentinel(tmp_path)
    before_out = tree_hash(outside)
    backend = ExitedBackend()
    orchkit.use_backend(monkeypatch, backend)
    cfg = load_config(tmp_path / "home")
    db = Database(cfg)
    for name in ("hostile", "bystander"):
        submit(db, cfg, SubmitRequest(name=name, command=["python", "-m", "orch_trainer"]))
    hostile = cfg.runs_root / "hostile"
    (protocol.attempt_dir(hostile, 1) / "failure.json").write_bytes(HOSTILE_FAILURES[case])
    rep = reconcile_pass(db, cfg, backend_for=lambda _n: backend)
    changed = {c["name"]: c for c in rep.as_dict()["changed"]}
    assert set(changed) == {"hostile", "bystander"}, rep.as_dict()
    assert changed["bystander"]["to"] == "retryable_failed"
    assert changed["hostile"]["class"] in protocol.FAILURE_CLASSES
    with home_env(cfg.home, db_url):
        res = invoke("show", "hostile", "--json")
    assert res.exit_code == 0, res.output
    a = json.loads(res.stdout)["attempts"][0]
    assert len(a["detail"] or "") <= 2000
    assert a["failure_step"] is None or 0 <= a["failure_step"] < 2**63
    assert tree_hash(outside) == before_out
    db.engine.dispose()


# =================================================================================================
# refusals (exit 3)
# =================================================================================================
def test_symlinked_run_dir_is_refused_with_exit_3_and_nothing_outside_changes(tmp_path: Path) -> None:
    outside = sentinel(tmp_path)
    before = tree_hash(outside)
    with home_env(tmp_path / "home") as home:
        (home / "runs").mkdir(parents=True)
        (home / "runs" / "evil").symlink_to(outside)
        assert_one_line_error(invoke("submit", "--name", "evil", "--", "true"), 3, "symlink")
        # orch verify of the name reads through nothing either.
        res = invoke("verify", "evil")
        assert res.exit_code == 4 and res.output.startswith("CORRUPT: run dir is a symlink"), res.output
    assert tree_hash(outside) == before


def test_submit_over_a_verified_run_is_refused_with_exit_3(tmp_path: Path) -> None:
    with home_env(tmp_path / "home") as home:
        rd = home / "runs" / "done"
        (rd / "result").mkdir(parents=True)
        (rd / "result" / "model.pt").write_bytes(MODEL)
        protocol.write_done_marker(rd, "done", 1, ["result/model.pt"])
        before = tree_hash(rd)
        assert_one_line_error(invoke("submit", "--name", "done", "--", "true"), 3, "verified")
        assert tree_hash(rd) == before


# =================================================================================================
# the real entry point, in a subprocess (a sample of the cases above)
# =================================================================================================
def test_cli_subprocess_sample(tmp_path: Path) -> None:
    exe = [str(ROOT / ".venv" / "bin" / "orch")] if (ROOT / ".venv" / "bin" / "orch").exists() else [
        sys.executable, "-m", "orchestrator.cli"]
    rd, outside = _run_dir(tmp_path)
    (rd / "done.json").write_bytes(b"[" * 200_000 + b"]" * 200_000)
    bad_toml_home = tmp_path / "tomlhome"
    bad_toml_home.mkdir()
    (bad_toml_home / "orch.toml").write_text("[policy]\nmax_attempts = 'three'\n")
    cases = [
        (["submit", "--name", "../../etc", "--", "true"], tmp_path / "h1", 2, "--name"),
        (["submit", "--name", "ok", "--mem", "4GB\n#SBATCH --uid=0", "--", "true"], tmp_path / "h2", 2, "--mem"),
        (["submit", "--name", "ok", "--time", "1:60", "--", "true"], tmp_path / "h3", 2, "--time"),
        (["status"], bad_toml_home, 2, "orch.toml"),
        (["verify", str(rd)], tmp_path / "h4", 4, "CORRUPT"),
        (["show", "nope"], tmp_path / "h5", 2, "nope"),
    ]
    watched = [rd, outside, bad_toml_home]
    before = [tree_hash(d) for d in watched]
    for argv, home, code, needle in cases:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        env["ORCH_HOME"] = str(home)
        p = subprocess.run([*exe, *argv], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == code, (argv, p.returncode, p.stderr)
        assert "Traceback" not in p.stderr + p.stdout, p.stderr
        text = p.stdout if code == 4 else p.stderr
        lines = [ln for ln in text.splitlines() if ERROR_LINE.match(ln) or ln.startswith("CORRUPT")]
        assert len(lines) == 1 and needle.lower() in lines[0].lower(), (argv, text)
        if code == 2 and argv[0] == "submit":
            assert not home.exists(), "ORCH_HOME was created for a refused argument"
    assert [tree_hash(d) for d in watched] == before, "a refused command wrote or deleted something"
