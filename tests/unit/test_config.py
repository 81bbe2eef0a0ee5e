"""orch.toml strictness and ONE schema: a misspelt key inside a known table is a usage error
naming the key and the table's keys, and orch.toml and the CLI refuse the same values."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from orchestrator.core.config import load_config
from orchestrator.core.settings import KNOWN_KEYS, NUMERIC, setting
from orchestrator.errors import UsageError

POLICY_KEYS = ("auto_requeue, backoff_cap_s, caps, crash_backoff_s, hang_timeout_s, input_missing_attempts, "
               "keep_last_k, max_attempts, nan_lr_factor, nan_rollback_steps, no_progress_attempts, "
               "oom_mem_cap_mb, oom_mem_factor, slow_factor, uncounted")


def _load(tmp_path: Path, text: str):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "orch.toml").write_text(text)
    return load_config(home), home / "orch.toml"


def _refused(tmp_path: Path, text: str) -> str:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "orch.toml").write_text(text)
    with pytest.raises(UsageError) as e:
        load_config(home)
    msg = str(e.value)
    assert "\n" not in msg
    return msg.replace(f"{home / 'orch.toml'}: ", "<toml>: ")


@pytest.mark.parametrize("text,message", [
    ("[policy]\nmax_atempts = 2\n", f"<toml>: unknown key 'max_atempts' in [policy]; [policy] has {POLICY_KEYS}"),
    ("[runs]\nroott = '/x'\n", "<toml>: unknown key 'roott' in [runs]; [runs] has group_shared, root"),
    ("[reconcile]\nx = 1\n", "<toml>: unknown key 'x' in [reconcile]; [reconcile] has busy_timeout_ms, lease_ttl_s"),
    ("[metrics]\nx = 1\n", "<toml>: unknown key 'x' in [metrics]; [metrics] has textfile_dir"),
    ("[spot]\nx = 1\n", "<toml>: unknown key 'x' in [spot]; [spot] has interval_s, notice, url"),
])
def test_a_misspelt_key_in_a_known_table_is_refused_naming_it_and_the_tables_keys(tmp_path, text, message):
    assert _refused(tmp_path, text) == message


def test_a_misspelt_class_in_policy_caps_is_refused_naming_it(tmp_path):
    msg = _refused(tmp_path, "[policy.caps]\nnan2 = 1\n")
    assert msg.startswith("<toml>: unknown key 'nan2' in [policy.caps]; [policy.caps] has cancelled, crash, "), msg
    assert "no_progress" in msg and "input_missing" in msg


@pytest.mark.parametrize("text,message", [
    ("[policy]\nmax_attempts = 0\n", "<toml>: policy.max_attempts must be an integer 1..1000, got 0"),
    ("[policy]\nmax_attempts = 1001\n", "<toml>: policy.max_attempts must be an integer 1..1000, got 1001"),
    ("[policy]\nmax_attempts = 2.5\n", "<toml>: policy.max_attempts must be an integer 1..1000, got 2.5"),
    ("[policy]\nmax_attempts = true\n", "<toml>: policy.max_attempts must be an integer 1..1000, got True"),
    ("[policy]\ninput_missing_attempts = 0\n",
     "<toml>: policy.input_missing_attempts must be an integer 1..1000, got 0"),
    ("[policy]\nno_progress_attempts = -1\n", "<toml>: policy.no_progress_attempts must be an integer 0..1000, got -1"),
    ("[policy]\nbackoff_cap_s = nan\n", "<toml>: policy.backoff_cap_s must be a number 0..1e+09, got nan"),
    ("[policy]\ncrash_backoff_s = 1e300\n", "<toml>: policy.crash_backoff_s must be a number 0..1e+09, got 1e+300"),
    ("[reconcile]\nbusy_timeout_ms = -5\n", "<toml>: reconcile.busy_timeout_ms must be an integer 0..1e+09, got -5"),
    ("[policy.caps]\nnan = -1\n", "<toml>: policy.caps.nan must be an integer 0..1000000, got -1"),
    ("[nodes]\nsuspect_failures = -1\n", "<toml>: nodes.suspect_failures must be an integer 0..1000, got -1"),
    ("[nodes]\nsuspect_window_s = 0\n", "<toml>: nodes.suspect_window_s must be a number 1..1e+09, got 0"),
    ("[nodes]\nexclusion_s = nan\n", "<toml>: nodes.exclusion_s must be a number 0..1e+09, got nan"),
])
def test_a_value_out_of_the_schemas_bounds_is_refused_naming_the_key(tmp_path, text, message):
    assert _refused(tmp_path, text) == message


def test_the_new_policy_keys_are_read(tmp_path):
    cfg, _ = _load(tmp_path, "[policy]\ninput_missing_attempts = 5\nno_progress_attempts = 0\nbackoff_cap_s = 60\n"
                             "max_attempts = 1000\n")
    assert (cfg.input_missing_attempts, cfg.no_progress_attempts, cfg.backoff_cap_s, cfg.max_attempts) == \
        (5, 0, 60.0, 1000)


def test_the_suspect_node_keys_are_read(tmp_path):
    cfg, _ = _load(tmp_path, "[nodes]\nsuspect_failures = 0\nsuspect_window_s = 60\nexclusion_s = 120\n")
    assert (cfg.suspect_failures, cfg.suspect_window_s, cfg.exclusion_s) == (0, 60.0, 120.0)


def test_defaults_come_from_the_schema(tmp_path):
    cfg = load_config(tmp_path / "empty-home")
    for s in NUMERIC:
        assert getattr(cfg, s.key) == s.default, s.name


def test_the_cli_option_and_orch_toml_share_the_bounds():
    from orchestrator.cli.submit_cmd import submit

    opt = next(p for p in submit.params if p.name == "max_attempts")
    s = setting("policy.max_attempts")
    assert isinstance(opt.type, click.IntRange) and (opt.type.min, opt.type.max) == (s.lo, s.hi)
    assert opt.help == s.help


def test_every_numeric_setting_is_a_known_key_of_its_table():
    for s in NUMERIC:
        assert s.key in KNOWN_KEYS[s.table], s.name


@pytest.mark.parametrize("value", [0, 1001, 10**12, True])
def test_the_submitit_executor_checks_orch_max_attempts_against_the_same_schema(value):
    # orch_max_attempts=10**12 passed (only a minimum was checked) and reached the DB row.
    from orchestrator.ops.executor import OrchExecutor

    with pytest.raises(ValueError) as e:
        OrchExecutor(backend="local").update_parameters(orch_max_attempts=value)
    assert str(e.value) == f"orch_max_attempts={value!r}: policy.max_attempts must be an integer 1..1000, got {value!r}"
