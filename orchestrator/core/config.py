"""Where orch keeps its things ($ORCH_HOME) and what orch.toml may change.

Read on every command, so it imports only the stdlib. A malformed orch.toml is a usage error that
names the file and the key, found before anything is written.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.settings import KNOWN_KEYS, MAX_COUNT, NUMERIC, unknown_key_message
from orchestrator.errors import UsageError
from orchestrator.protocol.durable import BadRecord, read_bounded
from orchestrator.protocol.layout import FAILURE_CLASSES, FailureClass, Fault

CONFIG_LIMIT = 1 << 20  # orch.toml is a few lines; a bigger one is not a config file
# The defaults of the design's policy section, read from the classes' own traits (FailureClass.auto_requeue,
# .counted, .cap): which classes reconcile requeues by itself, which count against --max-attempts, per-class caps.
AUTO_REQUEUE: frozenset[FailureClass] = frozenset(c for c in FailureClass if c.auto_requeue)
UNCOUNTED: frozenset[FailureClass] = frozenset(c for c in FailureClass if not c.counted)
CLASS_CAPS: dict[FailureClass, int] = {c: c.cap for c in FailureClass if c.cap is not None}

# Always uncounted, whatever policy.uncounted says: neither is the job's fault, and docs/concepts/failures.md's policy
# table promises it (preempted 3 times at one step with --max-attempts 2 ended failed).
NEVER_COUNTED: frozenset[FailureClass] = frozenset(c for c in FailureClass if c.fault is Fault.PLATFORM)


def _d(name: str) -> Any:
    """The schema's default of ``table.key`` (orchestrator.core.settings declares each setting once)."""
    from orchestrator.core.settings import setting

    return setting(name).default


@dataclass
class Config:
    home: Path
    runs_root: Path
    trash: Path
    db_url: str
    auto_requeue: frozenset[FailureClass] = AUTO_REQUEUE
    uncounted: frozenset[FailureClass] = UNCOUNTED
    caps: dict[FailureClass, int] = field(default_factory=lambda: dict(CLASS_CAPS))
    # The numeric settings: bounds, defaults and meaning in orchestrator/core/settings.py.
    max_attempts: int = _d("policy.max_attempts")
    nan_rollback_steps: int = _d("policy.nan_rollback_steps")
    nan_lr_factor: float = _d("policy.nan_lr_factor")
    oom_mem_factor: float = _d("policy.oom_mem_factor")
    oom_mem_cap_mb: int = _d("policy.oom_mem_cap_mb")
    crash_backoff_s: float = _d("policy.crash_backoff_s")
    backoff_cap_s: float = _d("policy.backoff_cap_s")
    hang_timeout_s: float = _d("policy.hang_timeout_s")
    slow_factor: float = _d("policy.slow_factor")
    keep_last_k: int = _d("policy.keep_last_k")
    input_missing_attempts: int = _d("policy.input_missing_attempts")
    no_progress_attempts: int = _d("policy.no_progress_attempts")
    suspect_failures: int = _d("nodes.suspect_failures")
    suspect_window_s: float = _d("nodes.suspect_window_s")
    exclusion_s: float = _d("nodes.exclusion_s")
    lease_ttl_s: float = _d("reconcile.lease_ttl_s")
    busy_timeout_ms: int = _d("reconcile.busy_timeout_ms")
    group_shared: bool = False  # run dirs 0750 / files 0640 instead of 0700 / 0600
    spot_notice: str = "off"  # whose spot interruption notices job wrappers watch (submit --spot-notice)
    spot_url: str | None = None  # the metadata service's base URL; None: the clouds' 169.254.169.254
    spot_interval_s: float = 5.0
    # node_exporter's textfile-collector dir: every reconcile pass rewrites <dir>/orch.prom there
    metrics_textfile_dir: Path | None = None

    @property
    def umask(self) -> int:
        """For orch's own files and every job it starts (a shared login node)."""
        return 0o027 if self.group_shared else 0o077


def orch_home() -> Path:
    raw = os.environ.get("ORCH_HOME") or str(Path.home() / ".orch")
    if "\x00" in raw:
        raise UsageError("ORCH_HOME contains a NUL byte")
    try:
        return Path(raw).expanduser()
    except RuntimeError as e:
        raise UsageError(f"ORCH_HOME {raw!r}: {e}") from None


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL; None for another database or an in-memory one."""
    if url.startswith("sqlite:///") and ":memory:" not in url:
        return Path(url[len("sqlite:///"):])
    return None


ENV_METRICS_DIR = "ORCH_METRICS_TEXTFILE_DIR"  # overrides [metrics] textfile_dir ("" turns it off)


def _get(tbl: dict, key: str, typ: type | tuple[type, ...], path: str) -> Any:
    v = tbl[key]
    if not isinstance(v, typ) or isinstance(v, bool) and typ is not bool:
        names = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
        raise UsageError(f"orch.toml: {path}{key} must be {names}, got {v!r}")
    return v


def load_config(home: Path | None = None) -> Config:
    """Defaults, overlaid by ``$ORCH_HOME/orch.toml`` when it exists, then by the environment.
    Creates nothing."""
    home = (home or orch_home()).absolute()
    # The home becomes part of the SQLite URL (`?` starts its query: ORCH_HOME=/x/y?mode=ro created /x/y, outside
    # ORCH_HOME) and of Alembic's ini-style config (`%` interpolates): refuse what either would misread.
    bad = sorted({c for c in str(home) if c in "?#%" or not c.isprintable()})
    if bad:
        raise UsageError(f"ORCH_HOME {str(home)[:200]!r} contains {', '.join(map(repr, bad))}: not supported in a "
                         "path orch builds its DB URL from; choose another directory")
    url = os.environ.get("ORCH_DB_URL")
    if url is not None and url.startswith("sqlite") and (url.rstrip("/") in ("sqlite:", "sqlite:/", "sqlite://")
                                                         or ":memory:" in url):
        raise UsageError("ORCH_DB_URL names no SQLite file (in-memory or empty): the job table would vanish at "
                         "exit; name a file, e.g. sqlite:////home/me/orch.db")
    if url is not None and url.startswith("sqlite") and "///" in url:
        # sqlite:///relative.db made a DB in whatever directory orch happened to run from: one job table per cwd.
        rel = url.split("///", 1)[1].split("?", 1)[0]
        if rel and not rel.startswith("/"):
            raise UsageError(f"ORCH_DB_URL names a relative SQLite path {rel[:200]!r}: it would depend on the "
                             "current directory; use an absolute one, e.g. sqlite:////home/me/orch.db")
        # sqlite:////dev/null: SQLite wrote /dev/null-journal and orch its migrate lock beside it (hostile
        # test): the DB must be a regular file, or a name where one can be made.
        target = Path(rel) if rel.startswith("/") else None
        if target is not None and (target.exists() or target.is_symlink()) and not target.is_file():
            raise UsageError(f"ORCH_DB_URL names {rel[:200]!r}, which is not a regular file; name a DB file")
    cfg = Config(home=home, runs_root=home / "runs", trash=home / "trash",
                 db_url=os.environ.get("ORCH_DB_URL") or f"sqlite:///{home / 'orch.db'}")
    path = home / "orch.toml"
    if path.exists():
        _overlay_file(cfg, path)
    env_dir = os.environ.get(ENV_METRICS_DIR)
    if env_dir is not None:
        cfg.metrics_textfile_dir = _absolute_dir(env_dir, ENV_METRICS_DIR) if env_dir else None
    return cfg


def _absolute_dir(raw: str, what: str) -> Path:
    """An absolute directory path from the user; a usage error naming ``what`` otherwise."""
    if "\x00" in raw or not raw.isprintable():
        raise UsageError(f"{what} {raw!r} contains control characters")
    try:
        p = Path(raw).expanduser()
    except RuntimeError as e:  # "~nosuchuser/runs": no such user's home
        raise UsageError(f"{what} {raw!r}: {e}") from None
    if not p.is_absolute():
        raise UsageError(f"{what} must be an absolute path, got {str(p)!r}")
    return p


TABLES = frozenset(KNOWN_KEYS)  # what orch.toml may hold at top level


def _table(data: dict, name: str, path: Path) -> dict:
    """``[name]`` of orch.toml ({} when absent); a usage error if it is not a table or holds an unknown key."""
    tbl = data.get(name, {})
    if not isinstance(tbl, dict):
        raise UsageError(f"{path}: [{name}] must be a table")
    # A misspelt key ([policy] max_atempts) was silently ignored, and its setting with it.
    unknown = sorted(set(tbl) - KNOWN_KEYS[name])
    if unknown:
        raise UsageError(f"{path}: {unknown_key_message(name, unknown[0], KNOWN_KEYS[name])}")
    return tbl


def _overlay_file(cfg: Config, path: Path) -> None:
    try:
        # Non-blocking, a regular file only, size-capped: a FIFO here hung every command (hostile test).
        text = read_bounded(path, CONFIG_LIMIT, follow=True).decode()
    except BadRecord as e:
        raise UsageError(f"{path}: {e} (orch.toml must be a small regular file)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path}: {e}") from None
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise UsageError(f"cannot read {path}: {e}") from None
    # A misspelt table ([polcy]) was silently ignored, and its settings with it (a hostile test).
    unknown = sorted(set(data) - TABLES)
    if unknown:
        raise UsageError(f"{path}: unknown table or key {unknown[0]!r}; orch.toml has [{'], ['.join(sorted(TABLES))}]")
    tables = {name: _table(data, name, path) for name in sorted(TABLES)}
    runs = tables["runs"]
    if "root" in runs:
        cfg.runs_root = _absolute_dir(_get(runs, "root", str, "runs."), f"{path}: runs.root")
    if "group_shared" in runs:
        cfg.group_shared = _get(runs, "group_shared", bool, "runs.")
    _load_policy_classes(cfg, tables["policy"], path)
    for s in NUMERIC:  # one schema: the CLI's --max-attempts checks the same bounds (orchestrator.core.settings)
        if s.key in tables[s.table]:
            v = tables[s.table][s.key]
            problem = s.problem(v)
            if problem is not None:
                raise UsageError(f"{path}: {problem}")
            setattr(cfg, s.key, float(v) if s.kind is float else v)
    _load_spot(cfg, data, path)
    met = tables["metrics"]
    if "textfile_dir" in met:
        cfg.metrics_textfile_dir = _absolute_dir(_get(met, "textfile_dir", str, "metrics."),
                                                 f"{path}: metrics.textfile_dir")


def _load_policy_classes(cfg: Config, pol: dict, path: Path) -> None:
    """``[policy]`` auto_requeue, uncounted and ``[policy.caps]``: keys and values that name failure classes."""
    for key in ("auto_requeue", "uncounted"):
        if key in pol:
            classes = _get(pol, key, list, "policy.")
            bad = [c for c in classes if c not in FAILURE_CLASSES]
            if bad:
                raise UsageError(f"{path}: policy.{key} names unknown classes {bad}")
            setattr(cfg, key, frozenset(FailureClass(c) for c in classes))
    if "caps" in pol:
        caps = _get(pol, "caps", dict, "policy.")
        unknown = sorted(c for c in caps if c not in FAILURE_CLASSES)
        if unknown:  # [policy.caps] nan2 = 1 was refused with a message that did not say which key was wrong
            raise UsageError(f"{path}: {unknown_key_message('policy.caps', unknown[0], set(FAILURE_CLASSES))}")
        for cls, n in caps.items():
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_COUNT:
                raise UsageError(f"{path}: policy.caps.{cls} must be an integer 0..{MAX_COUNT}, got {n!r}")
            cfg.caps[FailureClass(cls)] = n


def _load_spot(cfg: Config, data: dict, path: Path) -> None:
    """``[spot]``: whose spot notices job wrappers watch by default, where, how often."""
    from urllib.parse import urlsplit

    from orchestrator.jobside.spotnotice import CHOICES

    spot = _table(data, "spot", path)
    if "notice" in spot:
        v = _get(spot, "notice", str, "spot.")
        if v not in CHOICES:
            raise UsageError(f"{path}: spot.notice must be one of {', '.join(CHOICES)}, got {v!r}")
        cfg.spot_notice = v
    if "url" in spot:
        v = _get(spot, "url", str, "spot.")
        try:
            u = urlsplit(v)
            ok = u.scheme in ("http", "https") and bool(u.hostname) and u.port != 0
        except ValueError:  # a port out of range
            ok = False
        # It travels in the wrapper's argv and into a request line: no spaces or control characters.
        if not ok or not v.isprintable() or " " in v or len(v) > 500:
            raise UsageError(f"{path}: spot.url must be an http:// URL like http://169.254.169.254, got {v!r}")
        cfg.spot_url = v
    if "interval_s" in spot:
        v = _get(spot, "interval_s", (int, float), "spot.")
        if not 0.05 <= v <= 86400:
            raise UsageError(f"{path}: spot.interval_s must be a number 0.05..86400, got {v!r}")
        cfg.spot_interval_s = float(v)
