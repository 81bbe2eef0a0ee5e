"""Argument-only checks run before any row, directory or file exists (design lesson 2), and the
read commands' output contracts (`--json` is exactly one document; unknown job is a usage error).
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from click.testing import CliRunner

from orchestrator.cli import main


def assert_nothing_created(orch) -> None:
    """No run dir and no job row: either ORCH_HOME was never created, or it holds no trace."""
    if orch.runs.exists():
        assert list(orch.runs.iterdir()) == []
    db = orch.home / "orch.db"
    if db.exists():
        with sqlite3.connect(db) as c:
            assert c.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
            assert c.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0


BAD_SUBMITS = [
    ("name ../x", ["--name", "../x"], "invalid job name"),
    ("name a/b", ["--name", "a/b"], "invalid job name"),
    ("name with newline", ["--name", "a\nb"], "invalid job name"),
    ("name with trailing newline", ["--name", "abc\n"], "invalid job name"),
    ("name ..", ["--name", ".."], "invalid job name"),
    ("mem 4X", ["--mem", "4X"], "'4X' is not a memory size"),
    ("mem 0", ["--mem", "0"], "is not a memory size"),
    ("time 1:99", ["--time", "1:99"], "'1:99' is not a valid positive time"),
    ("time garbage", ["--time", "soon"], "'soon' is not a time"),
    ("outputs ../x", ["--outputs", "../x"], "'../x' must be a relative glob"),
    ("outputs /etc/passwd", ["--outputs", "/etc/passwd"], "'/etc/passwd' must be a relative glob"),
    ("outputs result/../../x", ["--outputs", "result/../../x"], "must be a relative glob"),
    ("partition with local", ["--partition", "gpu"], "need --backend slurm"),
    ("sbatch-arg with local", ["--sbatch-arg", "--qos=high"], "need --backend slurm"),
    ("sbatch-arg with newline", ["--backend", "slurm", "--sbatch-arg", "--qos=high\n#SBATCH --uid=0"],
     "not a plain value"),
    ("sbatch-arg naming an option orch owns, as a getopt prefix", ["--backend", "slurm", "--sbatch-arg",
     "--outp=/tmp/elsewhere"], "orch sets --outp itself"),
    ("sbatch-arg with trailing newline", ["--backend", "slurm", "--sbatch-arg", "--qos=high\n"],
     "not a plain value"),
    ("partition with newline", ["--backend", "slurm", "--partition", "gpu\n"], "not allowed in --partition"),
    ("account with #", ["--backend", "slurm", "--account", "a#SBATCH"], "not allowed in --account"),
    ("max-attempts 0", ["--max-attempts", "0"], "--max-attempts"),
    ("unknown backend", ["--backend", "k8s"], "'k8s' is not one of"),
    ("gpus -1", ["--gpus", "-1"], "--gpus"),
]


@pytest.mark.parametrize("args,message", [b[1:] for b in BAD_SUBMITS], ids=[b[0] for b in BAD_SUBMITS])
def test_invalid_submit_arguments_exit_2_before_anything_is_created(orch, monkeypatch, args, message):
    # In-process (CliRunner) for speed; the subprocess tests below cover the real entry point.
    monkeypatch.setenv("ORCH_HOME", str(orch.home))
    monkeypatch.delenv("ORCH_DB_URL", raising=False)
    r = CliRunner().invoke(main, ["submit", "--name", "ok-name", *args, "--", "bash", "-c", "exit 0"])
    assert r.exit_code == 2, (r.stdout, r.stderr, r.exception)
    assert message in r.stderr
    assert r.stdout == ""
    assert not orch.home.exists()  # argument checks run before ORCH_HOME or the DB is touched
    assert_nothing_created(orch)


def test_invalid_submit_into_an_existing_home_creates_no_row_and_no_dir(orch):
    orch("status", check=True)  # the DB now exists
    assert (orch.home / "orch.db").exists()
    for args, message in ((["--name", "x/../../y"], "invalid job name"), (["--mem", "12Q"], "not a memory size"),
                          (["--outputs", "/etc/passwd"], "must be a relative glob"),
                          (["--name", "nl\n"], "invalid job name")):
        p = orch("submit", *args, "--", "true")
        assert p.returncode == 2, p.stderr
        assert message in p.stderr and "Traceback" not in p.stderr
    assert_nothing_created(orch)
    assert orch.json("status") == []


def test_submit_without_a_command_is_a_usage_error(orch):
    p = orch.cli("submit", "--name", "x")
    assert p.returncode == 2 and "Missing argument 'COMMAND...'" in p.stderr
    assert not orch.home.exists()


def test_malformed_orch_toml_exits_2_naming_the_file_without_a_traceback(orch):
    orch.home.mkdir(mode=0o700, exist_ok=True)
    orch.write_config("[policy\nmax_attempts = ")
    p = orch.cli("status")
    assert p.returncode == 2
    assert str(orch.home / "orch.toml") in p.stderr and "Traceback" not in p.stderr
    p = orch.cli("submit", "--name", "t", "--", "true")
    assert p.returncode == 2 and str(orch.home / "orch.toml") in p.stderr
    assert not orch.runs.exists()


@pytest.mark.parametrize("toml,message", [
    ("[policy]\nmax_attempts = 'three'\n", "policy.max_attempts must be an integer 1..1000, got 'three'"),
    ("[policy]\nauto_requeue = ['crash', 'bogus']\n", "unknown classes ['bogus']"),
    ("[runs]\nroot = 'relative/path'\n", "runs.root must be an absolute path"),
    ("policy = 3\n", "[policy] must be a table"),
])
def test_orch_toml_with_wrong_values_exits_2_naming_the_key(orch, toml, message):
    orch.home.mkdir(mode=0o700, exist_ok=True)
    orch.write_config(toml)
    p = orch.cli("status")
    assert p.returncode == 2
    assert message in p.stderr and "orch.toml" in p.stderr and "Traceback" not in p.stderr


def test_status_json_is_exactly_one_json_list_with_the_contract_fields(orch):
    assert orch.json("status") == []
    orch("submit", "--name", "s1", "--outputs", "r.txt", "--", "bash", "-c", "echo x > r.txt", check=True)
    p = orch("status", "--json")
    assert p.returncode == 0
    rows = json.loads(p.stdout)  # raises if there is anything but one JSON document on stdout
    assert isinstance(rows, list) and len(rows) == 1
    row = rows[0]
    assert row["name"] == "s1" and row["attempts"] == 1
    assert row["state"] in ("submitted", "running", "done_marker_verified")
    assert row["run_dir"] == str(orch.runs / "s1")


def test_show_json_has_the_contract_fields(orch):
    orch("submit", "--name", "s2", "--", "true", check=True)
    p = orch("show", "s2", "--json")
    d = json.loads(p.stdout)
    assert {"name", "state", "run_dir", "attempts"} <= d.keys()
    assert d["name"] == "s2" and d["run_dir"] == str(orch.runs / "s2")
    (a,) = d["attempts"]
    assert {"n", "backend", "external_id", "state", "failure_class", "action"} <= a.keys()
    assert a["n"] == 1 and a["backend"] == "local" and a["external_id"]


@pytest.mark.parametrize("cmd", [["show", "nope"], ["show", "nope", "--json"], ["verify", "nope"],
                                 ["requeue", "nope"], ["cancel", "nope"], ["logs", "nope"]])
def test_unknown_job_exits_2_with_a_message(orch, cmd):
    p = orch.cli(*cmd)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "no job named 'nope'" in p.stderr
    assert p.stdout == ""


def test_requeue_needs_names_or_failed_but_not_both(orch):
    p = orch.cli("requeue")
    assert p.returncode == 2 and "give job NAMEs or --failed" in p.stderr
    p = orch.cli("requeue", "a", "--failed")
    assert p.returncode == 2 and "give job NAMEs or --failed" in p.stderr


def test_status_with_an_unknown_state_is_a_usage_error(orch):
    p = orch.cli("status", "--state", "done")
    assert p.returncode == 2 and "'done' is not one of" in p.stderr


def test_status_shows_live_and_recent_jobs_and_says_how_many_older_ones_it_left_out(orch):
    """At 100,000 mostly finished jobs listing them all took 3.6 s: the default shows the last 24 h's ends."""
    for name in ("old", "new"):
        orch("submit", "--name", name, "--", "true", check=True)
    with sqlite3.connect(orch.home / "orch.db") as c:
        c.execute("UPDATE jobs SET state = 'cancelled', updated_at = '2026-01-01 00:00:00.000000' WHERE name = 'old'")
    note = "1 job that ended before the last 24h not shown (orch status --since all)"
    p = orch.cli("status")
    assert p.returncode == 0 and "new" in p.stdout and "old" not in p.stdout.replace(note, "")
    assert p.stdout.rstrip().endswith(f"({note})")
    p = orch.cli("status", "--json")
    assert [r["name"] for r in json.loads(p.stdout)] == ["new"] and p.stderr == f"orch status: {note}\n"
    p = orch.cli("status", "--json", "--since", "all")
    assert [r["name"] for r in json.loads(p.stdout)] == ["old", "new"] and p.stderr == ""
    p = orch.cli("status", "--state", "cancelled", "--since", "2w")
    assert p.stdout == "no jobs in state cancelled; 1 job in state cancelled that ended before the last 2w not " \
                       "shown (orch status --since all)\n"
    p = orch.cli("status", "--since", "3x")
    assert (p.returncode, p.stdout) == (2, "") and "--since '3x': expected a number and a unit" in p.stderr
    for cmd in ("status", "report"):  # now - 999999 weeks overflowed datetime: "unexpected error", exit 1
        p = orch.cli(cmd, "--since", "999999w")
        assert (p.returncode, p.stdout) == (2, "") and "--since '999999w': at most 100 years" in p.stderr, p.stderr


COMMANDS = sorted(main.commands)


def test_cli_has_every_contract_command():
    assert set(COMMANDS) >= {"submit", "status", "show", "verify", "reconcile", "requeue", "cancel", "logs", "gc"}


@pytest.mark.parametrize("cmd", [[]] + [[c] for c in COMMANDS])
def test_help_of_every_command_works(cmd, tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    r = CliRunner().invoke(main, [*cmd, "--help"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("Usage: ")
    assert not (tmp_path / "home").exists()  # --help touches nothing


def test_a_relative_program_and_script_mean_the_submitters_directory(tmp_path, monkeypatch):
    """`orch submit -- python train.py`, the README's own, failed at once: the job runs in its run dir,
    where there is no train.py. The program and the first script argument that exists here become absolute;
    nothing else does (a module, code, a path the job creates, an argument after --)."""
    from orchestrator.cli.args import _absolute_program

    monkeypatch.chdir(tmp_path)
    for name in ("train.py", "prep.sh", "cfg.py"):
        (tmp_path / name).write_text("")
    here = str(tmp_path)
    assert _absolute_program(("python", "train.py", "--lr", "1")) == ("python", f"{here}/train.py", "--lr", "1")
    assert _absolute_program(("torchrun", "--nproc-per-node", "2", "train.py", "--config", "cfg.py")) == \
        ("torchrun", "--nproc-per-node", "2", f"{here}/train.py", "--config", "cfg.py")  # the first script only
    assert _absolute_program(("./prep.sh",)) == (f"{here}/prep.sh",)
    assert _absolute_program(("bash", "prep.sh")) == ("bash", f"{here}/prep.sh")
    for untouched in (("python", "-m", "train.py"), ("python", "-c", "train.py"), ("python", "absent.py"),
                      ("python", "/abs/train.py"), ("python", "--", "train.py"), ("python", "out/model.py")):
        assert _absolute_program(untouched) == untouched
