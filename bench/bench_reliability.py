#!/usr/bin/env python3
"""R1, R4, R6 and the adversarial suite: BENCHMARKS.md's reliability table, produced by running the tests.

The table was once written by hand, and said "foreground + background" for a kill sweep that only
covered foreground saves. Now every row is counted from a real pytest run (JUnit XML): a test that
kills a writer at each of its steps reports how many kill points it used through pytest's
``record_property("trials", n)``; any other test counts one trial per case. "violations" are failed
cases (each test asserts its invariant, not a symptom), and skipped cases are listed: a skip is not a pass.

Usage: ``.venv/bin/python bench/bench_reliability.py [--long] [--no-write] [--from-junit FILE]``
(``--long`` sets ``ORCH_LONG=1``: 100 random-time kills per writer, more hypothesis examples;
``--from-junit`` builds the table from the JUnit XML of a run that included both suites, e.g.
``pytest --junitxml=FILE -o junit_family=xunit1``, instead of running them again.)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

SUITES = ["tests/reliability", "tests/adversarial"]


@dataclass(frozen=True)
class Row:
    """One line of the table: which tests (by a regex over ``file::test[param]``) and what they do."""

    part: str
    what: str
    pattern: str


ROWS = [
    Row("R1 marker writer (`protocol.write_done_marker`)", "SIGKILL before each write/fsync/rename step in turn",
        r"test_crash_points\.py::test_marker_writer_killed_at_every_step"),
    Row("R1 checkpoint writer, foreground save", "SIGKILL before each step of a blocking save (write, fsync, "
        "manifest, commit rename, prune) in turn", r"test_checkpoint_writer_killed_at_every_step\[foreground"),
    Row("R1 checkpoint writer, background save", "SIGKILL before each step of the writer thread's save, "
        "the trainer's default", r"test_checkpoint_writer_killed_at_every_step\[background"),
    Row("R1 requeue clearing (`requeue_jobs` / `trash.move_to_trash`)", "SIGKILL before each step in turn",
        r"test_requeue_clearing_killed_at_every_step"),
    Row("R1 checkpoint writer, random times (foreground)", "SIGKILL at a random instant of a save loop",
        r"test_checkpoint_writer_killed_at_random_times(_long)?\[foreground"),
    Row("R1 checkpoint writer, random times (background)", "SIGKILL at a random instant of a background-save loop",
        r"test_checkpoint_writer_killed_at_random_times(_long)?\[background"),
    Row("R1 marker writer, random times", "SIGKILL at a random instant of a finish loop",
        r"test_marker_writer_killed_at_random_times"),
    Row("R1 crash-point coverage", "the instrumented writers expose >= 20 kill points",
        r"test_crash_points_cover"),
    Row("R4 bad input", "hypothesis and listed cases: job names, paths, `--mem`/`--time`, orch.toml, hostile "
        "done.json/failure.json, odd paths for verify", r"test_bad_input\.py"),
    Row("R6 DB", "upgrade from every revision on a populated DB; a lock held past the busy timeout; corrupt, "
        "newer-schema and directory DB files", r"test_db_faults\.py"),
    Row("A process identity", "SIGKILL to the wrapper alone; a 1 s boot-time shift (mount namespace); a job "
        "writing its own exit.json; a forged wrapper.json", r"test_process_identity\.py"),
    Row("A launch races", "cancel during a slow launch (before/after the backend call); DB deleted and the "
        "name resubmitted; `reconcile --watch` with its DB deleted/replaced", r"test_launch_races\.py"),
    Row("A hostile job files", "FIFOs named like job files; out-of-range JSON in each job-written file",
        r"test_hostile_files\.py"),
    Row("A checkpoint choice", "same-size bit flip in the newest checkpoint before a NaN rollback / a requeue",
        r"test_checkpoint_choice\.py"),
    Row("A confinement", "symlinked trash/ and trash/<job>; a 0755 ORCH_HOME", r"test_confinement\.py"),
    Row("A no stuck states", "refusals and launch errors after the row exists (EEXIST, ENOSPC on a full "
        "tmpfs, symlinked attempts/, unusable runs root); requeue of a verified job", r"test_no_stuck_states\.py"),
    Row("A exit codes", "closed stdout pipe; non-ASCII units; impossible runs roots; partial requeue errors",
        r"test_exit_codes\.py"),
    Row("A fencing", "a launcher SIGSTOPped past the launch grace (before / after its last check); a slow healthy "
        "launcher; the re-claim adoption race; a wrapper with a stale fence", r"test_fencing\.py"),
    Row("A bounded waits", "an `env -i setsid` escapee in the run dir; a stopped `orch sweep` holding the launch "
        "lock; lock waits naming the holder; a writer holding the DB; a FIFO at orch.toml", r"test_bounded_waits\.py"),
    Row("A permanent only when proven", "preempted again and again at one step; an input missing then back; a "
        "rollback target bit-flipped after the policy chose it", r"test_permanent_only_when_proven\.py"),
    Row("A strict input, hostile values", "misspelt options, NUL/oversize sweep values, --outputs over orch's files, "
        "closed pipes, extreme heartbeats, the status SQL, future heartbeats", r"test_strict_cli\.py"),
    Row("A mutation guards", "the launch-time marker check removed; each fsync of the marker removed",
        r"test_mutation_guards\.py"),
]


@dataclass
class Count:
    cases: int = 0
    trials: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0


def run_suite(xml: Path, long: bool) -> tuple[int, float]:
    env = {**os.environ, "ORCH_LONG": "1" if long else ""}
    t0 = time.monotonic()
    p = subprocess.run([C.PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                        "-o", "junit_family=xunit1", *SUITES], cwd=C.ROOT, env=env)
    return p.returncode, time.monotonic() - t0


def cases(xml: Path) -> Iterable[tuple[str, int | None, str, float]]:
    """(``file::name``, trials property or None, outcome, seconds) for every test case in the report."""
    for tc in ET.parse(xml).getroot().iter("testcase"):
        file = Path(tc.get("file") or tc.get("classname", "").replace(".", "/")).name
        ident = f"{file}::{tc.get('name')}"
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        outcome = ("failed" if tc.find("failure") is not None or tc.find("error") is not None
                   else "skipped" if tc.find("skipped") is not None else "passed")
        trials = int(props["trials"]) if "trials" in props else None
        yield ident, trials, outcome, float(tc.get("time") or 0)


def tally(xml: Path) -> tuple[dict[str, Count], list[str]]:
    counts = {r.part: Count() for r in ROWS}
    unmapped = []
    for ident, trials, outcome, secs in cases(xml):
        row = next((r for r in ROWS if re.search(r.pattern, ident)), None)
        if row is None:
            unmapped.append(ident)
            continue
        c = counts[row.part]
        c.cases += 1
        c.seconds += secs
        c.trials += trials if trials is not None else (0 if outcome == "skipped" else 1)
        c.failed += outcome == "failed"
        c.skipped += outcome == "skipped"
    return counts, unmapped


def render(counts: dict[str, Count], rc: int, wall: float, long: bool, unmapped: list[str]) -> str:
    rows = [(r.part, r.what, counts[r.part].cases, counts[r.part].trials, counts[r.part].failed,
             counts[r.part].skipped) for r in ROWS if counts[r.part].cases]
    total = sum(c.cases for c in counts.values())
    form = "long form (`--long`, ORCH_LONG=1)" if long else "short form (what every CI run does)"
    notes = (f"{form}: {total} test cases over {', '.join(SUITES)}, pytest exit {rc}, {wall:.0f} s. "
             "trials = kill points or random kills where a test reports them, else one per case; "
             "violations = failed cases; skipped cases did not run and prove nothing.\n\n"
             + C.table(["part", "what is done to it", "cases", "trials", "violations", "skipped"], rows)
             + "\n\nInvariants checked after every kill: a marker verifies ⇔ the result is complete; the previous "
             "verified checkpoint is intact and the newest committed one loads; no committed name holds a partial "
             "object; a sentinel tree outside the runs root is byte-identical; in the adversarial tests at most one "
             "live process tree per job at every sample and no job left pending/submitted without a live backend "
             "job after settling. Process kills only: data written but not yet fsynced survives a process kill, so "
             "power loss is not simulated (see docs/concepts/guarantees.md).")
    if unmapped:
        notes += "\n\nNot in any row (add them to ROWS): " + ", ".join(sorted(unmapped))
    return C.preamble("bench_reliability.py" + (" --long" if long else ""), notes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--long", action="store_true", help="ORCH_LONG=1: the long random-kill and hypothesis runs")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone")
    ap.add_argument("--from-junit", type=Path, help="JUnit XML (xunit1) of a finished run that included both suites")
    C.add_quick(ap)
    a = ap.parse_args()
    if a.quick and a.from_junit is None:
        ap.error("--quick needs --from-junit (CI tallies its own run's report: scripts/test.sh)")
    a.no_write = a.no_write or a.quick
    if a.from_junit is not None:
        root = ET.parse(a.from_junit).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0)) if suite is not None else 0
        counts, unmapped = tally(a.from_junit)
        rc = 1 if failed else 0
        wall = sum(c.seconds for c in counts.values())  # these suites' share of the larger run
        unmapped = [u for u in unmapped if re.match(r"test_(crash_points|bad_input|db_faults)\.py|"
                                                   r"test_(process_identity|launch_races|hostile_files|checkpoint_"
                                                   r"choice|confinement|no_stuck_states|exit_codes|fencing|bounded_waits|permanent_only_when_proven|"
                                                   r"strict_cli|mutation_guards)\.py", u)]
    else:
        with tempfile.TemporaryDirectory() as d:
            xml = Path(d) / "junit.xml"
            rc, wall = run_suite(xml, a.long)
            if not xml.exists():
                print("bench_reliability: pytest wrote no report", file=sys.stderr)
                return 1
            counts, unmapped = tally(xml)
    body = render(counts, rc, wall, a.long or bool(os.environ.get("ORCH_LONG")) and a.from_junit is None, unmapped)
    if a.from_junit is not None:
        body += ("\n\nCounted from the JUnit report of a whole-suite run (`--from-junit`); pytest exit = 1 if any "
                 "test of that run failed.")
    print(body)
    if not a.no_write:
        C.replace_section("Reliability suite (R1, R4, R6, adversarial)", body)
    return rc


if __name__ == "__main__":
    sys.exit(main())
