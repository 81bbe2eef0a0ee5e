"""The one schema of orch's numeric settings: each declared once (table, key, type, bounds, default, help).

``orch.toml`` (``orchestrator.core.config``) and the CLI (``--max-attempts`` in ``orchestrator.cli.args``)
both validate against it. Before it, each had its own bounds: ``max_attempts = 0`` was accepted in
orch.toml although ``--max-attempts 0`` was refused.

Stdlib only: it is read on every command, before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_NUMBER = 10**9  # seconds, MB, factors: generous, and far from datetime/SQLite overflow
MAX_COUNT = 10**6


@dataclass(frozen=True)
class Setting:
    """One numeric setting of orch.toml (``[table] key``), with its bounds (both inclusive)."""

    table: str
    key: str
    kind: type  # int (an integer only) or float (an integer or a float)
    lo: float
    hi: float
    default: int | float
    help: str

    @property
    def name(self) -> str:
        return f"{self.table}.{self.key}"

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not acceptable (a sentence naming the setting), or None when it is."""
        ok_type = (isinstance(value, int) if self.kind is int else isinstance(value, (int, float))) \
            and not isinstance(value, bool)
        # `lo <= v <= hi` is False for nan: hang_timeout_s = nan silently disabled hang detection, and a
        # number so large that date arithmetic overflows (crash_backoff_s = 1e300) crashed reconcile.
        if not ok_type or not self.lo <= value <= self.hi:  # type: ignore[operator]
            what = "an integer" if self.kind is int else "a number"
            return f"{self.name} must be {what} {self.lo:g}..{self.hi:g}, got {value!r}"
        return None


def _s(table: str, key: str, kind: type, lo: float, hi: float, default: int | float, help: str) -> Setting:
    return Setting(table, key, kind, lo, hi, default, help)


NUMERIC: tuple[Setting, ...] = (
    _s("policy", "max_attempts", int, 1, 1000, 3,
       "Attempts that count (preemptions, node failures and, by default, time limits do not); "
       "default: policy.max_attempts in orch.toml, else 3."),
    _s("policy", "nan_rollback_steps", int, 0, MAX_NUMBER, 1,
       "a NaN rollback resumes from the newest checkpoint at least this many steps before the bad step"),
    _s("policy", "nan_lr_factor", float, 0, MAX_NUMBER, 0.5, "the LR is multiplied by this after a NaN"),
    _s("policy", "oom_mem_factor", float, 0, MAX_NUMBER, 2.0, "--mem is multiplied by this after an OOM"),
    _s("policy", "oom_mem_cap_mb", int, 0, MAX_NUMBER, 512 * 1024, "the most memory an OOM retry asks for (MB)"),
    _s("policy", "crash_backoff_s", float, 0, MAX_NUMBER, 30.0,
       "the first back-off (seconds) of crash, input_missing and repeated no-progress preemption retries; "
       "doubled each time"),
    _s("policy", "backoff_cap_s", float, 0, MAX_NUMBER, 3600.0, "the longest back-off (seconds) of the growing ones"),
    _s("policy", "hang_timeout_s", float, 0, MAX_NUMBER, 600.0, "no heartbeat for this long: the job is hung"),
    _s("policy", "slow_factor", float, 0, MAX_NUMBER, 0.3,
       "flag jobs whose tokens/s falls below this fraction of their own median"),
    _s("policy", "keep_last_k", int, 0, MAX_NUMBER, 2, "what an enospc prune keeps"),
    _s("policy", "input_missing_attempts", int, 1, 1000, 3,
       "an input missing at start on this many consecutive attempts is permanent (invalid)"),
    _s("policy", "no_progress_attempts", int, 0, 1000, 3,
       "the job's own failures (timeout, crash, hang, oom, killed) without a newer checkpoint on this many "
       "consecutive attempts end it as no_progress; 0 turns the guard off"),
    # Suspect nodes (orchestrator/decide/suspects.py): on backends that can exclude nodes (Slurm).
    _s("nodes", "suspect_failures", int, 0, 1000, 3,
       "a node on which this many different jobs failed (crash, node_fail, hang, killed) within "
       "nodes.suspect_window_s is excluded from new attempts; 0 turns suspect nodes off"),
    _s("nodes", "suspect_window_s", float, 1, MAX_NUMBER, 21600.0,
       "the window (seconds) in which those failures must fall"),
    _s("nodes", "exclusion_s", float, 0, MAX_NUMBER, 43200.0,
       "how long (seconds) a suspect node stays excluded after the failure that made it one"),
    _s("reconcile", "lease_ttl_s", float, 0, MAX_NUMBER, 120.0, "how long a reconcile pass's lease lasts"),
    _s("reconcile", "busy_timeout_ms", int, 0, MAX_NUMBER, 30000, "how long a DB access waits for a lock"),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in NUMERIC}



@dataclass(frozen=True)
class Other:
    """A setting of orch.toml that is not one number (config.py parses and checks it): what it takes, its
    default, and what it does, as the settings reference (docs/reference/settings.md) shows it."""

    table: str
    key: str
    takes: str
    default: str
    help: str


OTHER: tuple[Other, ...] = (
    Other("runs", "root", "an absolute path", "$ORCH_HOME/runs",
          "where run dirs are made: on a cluster, a filesystem the compute nodes see"),
    Other("runs", "group_shared", "true or false", "false",
          "run dirs 0750 and their files 0640 (the group may read them) instead of 0700 / 0600"),
    # the three defaults below are the failure classes' own traits (config.py): the reference reads them there
    Other("policy", "auto_requeue", "a list of failure classes", "",
          "the classes `orch reconcile` requeues without a person"),
    Other("policy", "uncounted", "a list of failure classes", "",
          "the classes that do not count against max_attempts (preempted, node_fail and storage never count)"),
    Other("policy", "caps", "a table: class = integer 0..1000000", "",
          "give up after this many attempts of one class ([policy.caps] nan = 3)"),
    Other("metrics", "textfile_dir", "an absolute path", "off",
          "every reconcile pass rewrites orch.prom there, for node_exporter's textfile collector "
          "(ORCH_METRICS_TEXTFILE_DIR overrides; empty: off)"),
    Other("spot", "notice", "off, auto, aws, gcp or azure", "off",
          "whose spot interruption notices job wrappers watch by default (orch submit --spot-notice)"),
    Other("spot", "url", "an http:// URL", "http://169.254.169.254", "the metadata service the watcher polls"),
    Other("spot", "interval_s", "a number 0.05..86400", "5", "seconds between the watcher's polls"),
)

# Every key each orch.toml table may hold: the numeric ones and the others, each declared once above.
KNOWN_KEYS: dict[str, frozenset[str]] = {
    table: frozenset(s.key for s in (*NUMERIC, *OTHER) if s.table == table)
    for table in dict.fromkeys(s.table for s in (*OTHER, *NUMERIC))
}


def setting(name: str) -> Setting:
    """The setting ``table.key`` (a KeyError for a name not declared here: a programming error)."""
    return BY_NAME[name]


def unknown_key_message(table: str, key: str, known: frozenset[str] | set[str]) -> str:
    """One line naming the misspelt key and what the table accepts."""
    return f"unknown key {key!r} in [{table}]; [{table}] has {', '.join(sorted(known))}"
