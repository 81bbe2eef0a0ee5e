"""[metrics] textfile_dir and ORCH_METRICS_TEXTFILE_DIR: absolute paths only, the env var wins, "" turns it off."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.config import ENV_METRICS_DIR, load_config
from orchestrator.errors import UsageError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(ENV_METRICS_DIR, raising=False)
    h = tmp_path / "home"
    h.mkdir()
    return h


def test_off_unless_configured(home: Path) -> None:
    assert load_config(home).metrics_textfile_dir is None


def test_the_key_and_the_env_override(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (home / "orch.toml").write_text('[metrics]\ntextfile_dir = "/var/lib/node_exporter/textfile"\n')
    assert load_config(home).metrics_textfile_dir == Path("/var/lib/node_exporter/textfile")
    monkeypatch.setenv(ENV_METRICS_DIR, "/elsewhere")
    assert load_config(home).metrics_textfile_dir == Path("/elsewhere")
    monkeypatch.setenv(ENV_METRICS_DIR, "")
    assert load_config(home).metrics_textfile_dir is None


@pytest.mark.parametrize("toml,message", [
    ('metrics = 3\n', "[metrics] must be a table"),
    ('[metrics]\ntextfile_dir = 7\n', "metrics.textfile_dir must be str, got 7"),
    ('[metrics]\ntextfile_dir = "rel/dir"\n', "metrics.textfile_dir must be an absolute path, got 'rel/dir'"),
    ('[metrics]\ntextfile_dir = "/a\\nb"\n', "contains control characters"),
])
def test_bad_values_are_usage_errors_naming_the_key(home: Path, toml: str, message: str) -> None:
    (home / "orch.toml").write_text(toml)
    with pytest.raises(UsageError) as ei:
        load_config(home)
    assert message in str(ei.value)


def test_a_relative_env_value_is_refused_naming_the_variable(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_METRICS_DIR, "prom")
    with pytest.raises(UsageError, match=f"^{ENV_METRICS_DIR} must be an absolute path, got 'prom'$"):
        load_config(home)
