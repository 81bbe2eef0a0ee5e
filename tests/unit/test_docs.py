"""The documentation site: it builds in strict mode (a broken link, a missing anchor or a page left out of the nav
fails), and its generated reference pages say what the code says."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import envvars
from orchestrator.cli import reference

ROOT = Path(__file__).resolve().parents[2]


PICTURES = ("loss-across-preemptions.svg", "goodput-split.svg", "run.json")


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    """Stand-ins for the site's pictures, so these builds need not run the job that draws them (a real build
    does: tests/docs/test_docs_pictures.py)."""
    d = tmp_path_factory.mktemp("pictures")
    for name in PICTURES:
        (d / name).write_text("{}\n" if name.endswith(".json") else '<svg xmlns="http://www.w3.org/2000/svg"/>\n')
    return d


def _build(root: Path, site: Path, pictures: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=120, cwd=root,  # snippets' base
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "ORCH_DOCS_PICTURES": str(pictures)})


def test_the_docs_site_builds_in_strict_mode(tmp_path, pictures):
    p = _build(ROOT, tmp_path / "site", pictures)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    assert sorted(p.name for p in (tmp_path / "site" / "pictures").iterdir()) == sorted(PICTURES)


@pytest.mark.parametrize("breakage", ["nothing", "a link to a missing page", "a link to a missing anchor",
                                      "a page not in nav", "an included file missing", "a picture missing"])
def test_a_broken_link_or_a_page_outside_the_nav_fails_the_build(tmp_path, breakage, pictures):
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "scripts", copy / "scripts")  # the hook that adds the pictures
    if breakage != "an included file missing":
        shutil.copy(ROOT / "BENCHMARKS.md", copy / "BENCHMARKS.md")  # docs/explanation/benchmarks.md includes it
    if breakage == "nothing":  # the copy itself builds: each failure below is the breakage's
        p = _build(copy, tmp_path / "site", pictures)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return
    if breakage == "a picture missing":  # the hook refuses a folder without it, in one line
        partial = tmp_path / "partial"
        shutil.copytree(pictures, partial)
        (partial / "goodput-split.svg").unlink()
        p = _build(copy, tmp_path / "site", partial)
        said = p.stdout + p.stderr
        assert p.returncode == 1 and f"ORCH_DOCS_PICTURES={partial} lacks goodput-split.svg" in said, said[-2000:]
        assert "Traceback" not in said, said[-2000:]
        return
    if breakage == "a page not in nav":
        (copy / "docs" / "orphan.md").write_text("# Orphan\n")
    elif breakage != "an included file missing":
        target = "guides/nowhere.md" if breakage == "a link to a missing page" else "guides/sweeps.md#nowhere"
        with (copy / "docs" / "index.md").open("a") as f:
            f.write(f"\nSee [this]({target}).\n")
    p = _build(copy, tmp_path / "site", pictures)
    said = p.stdout + p.stderr
    if breakage == "an included file missing":  # snippets stops the build itself
        assert p.returncode == 1 and "Snippet at path 'BENCHMARKS.md' could not be found" in said, said[-2000:]
        return
    assert p.returncode == 1 and "Aborted with 1 warnings in strict mode" in said, said[-2000:]
    assert ("orphan.md" if breakage == "a page not in nav" else "nowhere") in said, said[-2000:]


def test_the_cli_reference_lists_every_command():
    text = reference.TARGET.read_text()
    assert [line[len("## orch "):] for line in text.splitlines() if line.startswith("## orch ")] == \
        reference.commands()
    assert len(reference.commands()) >= 15


def test_every_reference_page_is_generated_from_the_code():
    """docs/reference/{cli,settings,environment,kit-api,exit-codes}.md: regenerated here and compared (stale: this
    fails)."""
    pages = reference.pages()
    assert {p.name for p in pages} == {"cli.md", "settings.md", "environment.md", "kit-api.md", "exit-codes.md"}
    for path, text in pages.items():
        assert path.read_text() == text, f"{path} is stale: python -m orchestrator.cli.reference --write"


def test_every_orch_toml_key_is_in_the_settings_reference():
    from orchestrator.core.settings import KNOWN_KEYS

    page = (reference.PAGES / "settings.md").read_text()
    tables, keys, table = set(), set(), None
    for line in page.splitlines():  # each key under the table heading it follows
        if m := re.match(r"^## \[(\w+)\]$", line):
            table = m.group(1)
            tables.add(table)
        elif m := re.match(r"^\| `(\w+)` \|", line):
            keys.add((table, m.group(1)))
    assert tables == set(KNOWN_KEYS)
    assert keys == {(t, k) for t, ks in KNOWN_KEYS.items() for k in ks}


def _orch_names_in_source() -> set[str]:
    """Every string constant of the source that is an ORCH_* variable name."""
    names = set()
    for package in ("orchestrator", "orch_trainer", "trainer", "scripts"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and re.fullmatch(r"ORCH_[A-Z0-9_]+", node.value):
                    names.add(node.value)
    return names


def test_every_orch_variable_the_source_uses_is_declared_and_none_is_stale():
    declared = {v.name for v in envvars.VARIABLES if v.name.startswith("ORCH_")}
    used = _orch_names_in_source()
    assert used - declared == set(), f"used but not in orchestrator/envvars.py: {sorted(used - declared)}"
    assert declared - used == set(), f"declared but used nowhere: {sorted(declared - used)}"
    assert len({v.name for v in envvars.VARIABLES}) == len(envvars.VARIABLES)
    assert {v.group for v in envvars.VARIABLES} == set(envvars.GROUPS)


def _layout_names() -> dict[str, str]:
    """Every file and dir name protocol.layout declares for a run dir or a batch dir: constant -> name as written
    (a per-rank pattern up to its rank number: progress.rank-)."""
    from orchestrator.protocol import layout

    names = {}
    for const, value in vars(layout).items():
        if const.isupper() and isinstance(value, str) and not const.startswith(("ENV_", "MARKER_WRITER")):
            names[const] = value.split("{", 1)[0]
    return names


def test_every_run_dir_file_orch_declares_is_in_the_files_reference():
    from orchestrator.backends.slurm import sbatch

    page = (ROOT / "docs" / "reference" / "files.md").read_text()
    names = {**_layout_names(), "ARRAY_TASKS_FILE": sbatch.ARRAY_TASKS_FILE,
             "ARRAY_OUTPUT_PATTERN": sbatch.ARRAY_OUTPUT_PATTERN}
    assert len(names) >= 35, names
    assert {c: n for c, n in names.items() if n not in page} == {}


def test_every_exit_code_orch_and_its_trainer_give_is_declared_and_none_is_stale():
    """orch's: the errors' codes and the CLI's own; the bundled trainer's: protocol.EXIT_* and a crash's 1. The
    generated reference (docs/reference/exit-codes.md) renders the declaration; commands.md says orch's too."""
    from orchestrator import errors, exitcodes
    from orchestrator.cli import app, watch_cmd
    from orchestrator.protocol import layout

    orch_codes = {c.exit_code for c in vars(errors).values() if isinstance(c, type) and hasattr(c, "exit_code")}
    orch_codes |= {0, app.EXIT_NOT_VERIFIED, app.EXIT_BROKEN_PIPE, watch_cmd.EXIT_INTERRUPTED}
    trainer_codes = {v for k, v in vars(layout).items() if k.startswith("EXIT_") and isinstance(v, int)} | {1}
    declared = {p: {c.code for c in exitcodes.CODES if c.program == p} for p in exitcodes.PROGRAMS}
    assert declared == {"orch": orch_codes, "orch_trainer": trainer_codes}
    assert len({(c.program, c.code) for c in exitcodes.CODES}) == len(exitcodes.CODES)
    commands = (ROOT / "docs" / "reference" / "commands.md").read_text()
    assert {c for c in orch_codes if f"**{c}**" not in commands} == set()


def test_the_kit_api_page_has_every_public_name_each_with_its_docstring():
    import orchestrator.kit as kit

    page = (reference.PAGES / "kit-api.md").read_text()
    assert {n for n in kit.__all__ if f"### {n}\n" not in page} == set()
    assert "### orch_run\n" in page and "### OrchExecutor\n" in page
    assert "(no docstring)" not in page  # a public name or method without one: say what it does


def test_every_message_the_troubleshooting_page_quotes_is_one_orch_writes():
    """Each message of the table's first column, up to its first '...', is in orch's source as written."""
    page = (ROOT / "docs" / "guides" / "troubleshooting.md").read_text()
    source = "\n".join(p.read_text() for p in (ROOT / "orchestrator").rglob("*.py"))
    quoted = [q for row in page.splitlines() if row.startswith("| `")
              for q in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    assert len(quoted) >= 12, quoted
    assert [q for q in quoted if q not in source] == []


def test_the_recovery_matrix_has_every_failure_class_and_each_test_it_names_exists():
    from orchestrator.protocol.layout import FailureClass

    rows = [line.split(" | ") for line in (ROOT / "docs" / "explanation" / "recovery-matrix.md").read_text()
            .splitlines() if line.startswith("| ") and not line.startswith(("| what", "|---"))]
    classes = {c for row in rows for c in re.findall(r"`([a-z_]+)`", row[2])}
    assert classes == {c.value for c in FailureClass}, set(FailureClass) ^ classes
    for row in rows:
        path, _, name = re.fullmatch(r"`([^`]+)` \|", row[-1].strip()).group(1).partition("::")
        assert (ROOT / path).is_file(), path
        assert not name or f"def {name}(" in (ROOT / path).read_text(), f"{path}::{name}"


def test_every_decision_record_is_referred_to_by_the_code_it_explains_and_every_reference_exists():
    records = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "decisions").glob("*.md")}
    referred: dict[str, list[str]] = {}
    sources = [p for d in ("orchestrator", "orch_trainer", "packaging", "scripts")
               for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".toml")]
    for path in sources:
        for ref in re.findall(r"docs/decisions/[\w.-]+\.md", path.read_text()):
            referred.setdefault(ref, []).append(path.relative_to(ROOT).as_posix())
    assert set(referred) - records == set(), {r: referred[r] for r in set(referred) - records}
    assert records - set(referred) == set(), f"decision records no code refers to: {sorted(records - set(referred))}"
