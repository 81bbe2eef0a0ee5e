"""The pure functions behind strict input and crash-free displays (the CLI-level
behaviour is in tests/adversarial/test_strict_cli.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator import protocol
from orchestrator.errors import UsageError
from orchestrator.ops.sweep import MAX_VALUE_BYTES, load_params, parse_grid


# ------------------------------------------------------------------------------------------
# sweep values: NUL and oversize refused at parse time
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, why", [
    ("a\x00b", "NUL"), ("x" * (MAX_VALUE_BYTES + 1), "128 KiB"), ("\ud800", "not valid Unicode"),
    ("\u00e9" * (MAX_VALUE_BYTES // 2 + 1), "128 KiB"),  # 2 bytes each in UTF-8
])
def test_from_values_that_no_argument_can_carry_are_refused(value, why):
    with pytest.raises(UsageError, match=why):
        load_params('{"x": 1}\n' + json.dumps({"x": value}) + "\n", "f")


def test_an_argument_set_too_large_for_one_environment_string_is_refused():
    # each value fits, but ORCH_SWEEP_PARAMS would carry them all (and \u00e9 travels as \\u00e9)
    row = {f"k{i}": "\u00e9" * 4000 for i in range(10)}
    with pytest.raises(UsageError, match="f:1: the argument set is .* ORCH_SWEEP_PARAMS"):
        load_params(json.dumps(row) + "\n", "f")


def test_a_grid_whose_largest_set_is_too_large_for_one_environment_string_is_refused():
    axes = [f"k{i}=a," + "y" * 20_000 for i in range(7)]
    with pytest.raises(UsageError, match="--grid: the argument set is .* ORCH_SWEEP_PARAMS"):
        parse_grid(axes)


def test_values_at_the_limit_are_accepted():
    assert load_params(json.dumps({"x": "y" * 60_000}) + "\n", "f") == [{"x": "y" * 60_000}]


@pytest.mark.parametrize("axis, why", [("x=a\x00b,c", "NUL"), ("x=" + "y" * (MAX_VALUE_BYTES + 1), "128 KiB")])
def test_grid_values_that_no_argument_can_carry_are_refused(axis, why):
    with pytest.raises(UsageError, match=f"--grid x: .*{why}"):
        parse_grid([axis])


# ------------------------------------------------------------------------------------------
# --outputs never matches orch's own files
# ------------------------------------------------------------------------------------------
OWN = ["done.json", "run_config.json", "attempts/1/exit.json", "attempts/1/exit.reserve",
       "checkpoints/step-00000001/manifest.json", ".faults_fired.json", "tensorboard/x"]


@pytest.mark.parametrize("pattern", ["**", "**/*", "[a]ttempts/**", "*", "*.json", "done.*", "run_*", ".*",
                                     "tensorboard/*", "*/1/exit.reserve", "*/*/*", "a*/**", "[d]one.json",
                                     "**/manifest.json", "./done.json", "**/.faults*"])
def test_a_glob_matching_any_orch_owned_file_is_refused(pattern):
    import click

    from orchestrator.cli.args import _outputs_cb, orch_owned_match

    assert orch_owned_match(pattern) is not None
    with pytest.raises(click.BadParameter, match="orch's own"):
        _outputs_cb(None, None, (pattern,))


@pytest.mark.parametrize("pattern", ["out/**", "*.pt", "result/*", "o", "model.safetensors", "out/**/*.json",
                                     "*.txt", "logs/*.log"])
def test_a_glob_of_result_files_is_accepted(pattern):
    from orchestrator.cli.args import _outputs_cb

    assert _outputs_cb(None, None, (pattern,)) == (pattern,)


@pytest.mark.parametrize("rel", [*OWN, "attempts", ".done.json.tmp-123", "./done.json"])
def test_orch_owned_paths_are_recognised(rel):
    assert protocol.is_orch_owned(rel)


@pytest.mark.parametrize("rel", ["out/done.json", "result/x", "o", "my_checkpoints/a", "attemptsx/1"])
def test_result_paths_are_not_orch_owned(rel):
    assert not protocol.is_orch_owned(rel)


def test_the_wrappers_outputs_listing_skips_orch_owned_files(tmp_path: Path):
    """The backstop for a job submitted before the parse-time refusal: `**` lists only result files."""
    from orchestrator.jobside.ballast import Ballast
    from orchestrator.jobside.wrapper import write_outputs_marker

    for rel in [*OWN, "out/a.txt", "b.pt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / "done.json").unlink()
    assert write_outputs_marker(tmp_path, "j", 1, ["**"], Ballast(tmp_path / "attempts/1/exit.reserve", size=1)) is None
    marker = json.loads((tmp_path / "done.json").read_text())
    listed = sorted(marker["artifacts"])
    assert listed == ["b.pt", "out/a.txt"], marker
    assert protocol.verify_done_marker(tmp_path).verified


# ------------------------------------------------------------------------------------------
# displays: no crash on any job-written value
# ------------------------------------------------------------------------------------------
def test_plausible_drops_extreme_fields_one_by_one():
    from orchestrator.views.progressbounds import plausible

    got = plausible({"step": 2**63 - 1, "max_steps": 100, "loss": 1e308, "time": -1e308, "tokens_per_s": 5.0,
                     "eval_loss": -1e300, "note": "x"})
    assert got == {"max_steps": 100, "tokens_per_s": 5.0, "note": "x"}
    assert plausible(None) == {}


@pytest.mark.parametrize("seconds, text", [(math.inf, ">999d"), (1e308, ">999d"), (-5.0, "0:00:00"),
                                           (3725.0, "1:02:05")])
def test_clock_never_raises(seconds, text):
    from orchestrator.views.progressview import clock

    assert clock(seconds) == text


def test_an_eta_from_extreme_heartbeats_is_finite_or_none():
    from orchestrator.views.progressview import JobProgress, RateMeter, stats_text

    meter = RateMeter()
    base = dict(name="x", state="running", attempt=1, attempt_state="running", restarts=0, settled=False)
    for step, t in ((0, 1.0), (2**53, 1.0 + 1e-300), (2**53, 2.0)):
        snap = JobProgress(**base, step=step, max_steps=2**53, beat_time=t, tokens_per_s=1e-300, tokens_per_step=1)
        eta = meter.eta_s(snap)
        assert eta is None or math.isfinite(eta)
        stats_text(snap)


def test_show_text_escapes_control_characters():
    from orchestrator.cli.read import printable

    assert printable("ok \u00e9") == "ok \u00e9"
    assert printable("a\x1b[2Jb\r\n\x9b\x07") == "a\\x1b[2Jb\\r\\n\\x9b\\x07"


def test_status_flags_ignore_extreme_heartbeat_fields(tmp_path: Path):
    """A running job's heartbeat of time -1e308 flagged it hung, and 1e308 tok/s was shown as measured."""
    from orchestrator.core.config import Config
    from orchestrator.views.status import _progress_flags

    protocol.write_progress(tmp_path, 1, step=5, time=-1e308, tokens_per_s=1e308)
    cfg = Config(home=tmp_path, runs_root=tmp_path, trash=tmp_path, db_url="")
    row: dict = {"flags": []}
    _progress_flags(cfg, tmp_path, 1, row)
    assert (row["step"], row["tokens_per_s"], row["flags"]) == (5, None, [])
