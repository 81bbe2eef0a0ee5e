"""docs/reference/files.md against real run dirs: every file two real jobs leave (the bundled trainer preempted by
a real SIGTERM and rolled back after a NaN; the plain-loop example on two ranks) is listed, and every field of
orch's records in them is named in the page's fields section. A file or field added to the code and not to the
page fails here."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from orchkit import ROOT

PAGE = ROOT / "docs" / "reference" / "files.md"
TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--max-steps", "60", "--save-interval", "10",
           "--heartbeat-interval", "0.05", "--inject-fault", "sigterm@step=22", "--inject-fault", "nan@step=45"]
LOOP = [sys.executable, str(ROOT / "examples" / "plain_loop.py"), "--max-steps", "40", "--save-every", "10"]
# Directories whose contents are the program's or the checkpoint's own: listed as the directory.
OWN_DIRS = ("checkpoints/step-<8 digits>/", "result/", "attempts/<n>/torchrun/")
# The bundled trainer's own records: their fields are the trainer's (its guide), not orch's protocol.
TRAINERS_OWN = {"attempts/<n>/program.json", "run_config.json", "checkpoints/step-<8 digits>/meta.json",
                "result/metrics.json"}


def _pattern(rel: str) -> str:
    """A run-dir path as the page spells it."""
    rel = re.sub(r"^attempts/\d+/", "attempts/<n>/", rel)
    rel = re.sub(r"step-\d{8}", "step-<8 digits>", rel)
    rel = re.sub(r"\.rank-\d{5}\.json$", ".rank-<r>.json", rel)
    return re.sub(r"rank-end\.[0-9a-f]+\.\d+\.json$", "rank-end.<launch>.<rank>.json", rel)


def _documented_fields(page: str) -> dict[str, set[str]]:
    """Each '### <files>' section's table: the backticked names of its first column, per file it heads."""
    out: dict[str, set[str]] = {}
    for head, body in re.findall(r"^### (.+?)\n(.*?)(?=^### |\Z)", page, flags=re.S | re.M):
        names = {n for row in re.findall(r"^\| (.+?) \|", body, flags=re.M) for n in re.findall(r"`([^`]+)`", row)}
        for f in re.split(r", | and ", head):
            out[f.strip()] = names
    return out


def _records(run_dir: Path) -> dict[str, set[str]]:
    """Every JSON record of the run dir, by its page spelling: the union of its top-level keys."""
    keys: dict[str, set[str]] = {}
    for path in run_dir.rglob("*.json*"):
        if path.suffix not in (".json", ".jsonl") or not path.is_file():
            continue
        text = path.read_text()
        objs = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
            else [json.loads(text)]
        rel = _pattern(path.relative_to(run_dir).as_posix())
        keys.setdefault(rel, set()).update(k for o in objs if isinstance(o, dict) for k in o)
    return keys


def test_every_file_and_field_of_real_run_dirs_is_in_the_files_reference(orch):
    one = orch("submit", "--name", "rd", "--", *TRAINER)
    two = orch("submit", "--name", "mr", "--nproc-per-node", "2", "--", *LOOP)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    for name in ("rd", "mr"):
        assert orch("watch", name, "--plain", timeout=600).returncode == 0, orch("show", name).stdout
    assert [a["failure_class"] for a in orch.show("rd")["attempts"]] == ["preempted", "nan", None]

    page = PAGE.read_text()
    listing = page[page.index("A run dir ("):page.index("## The records' fields")]
    fields = _documented_fields(page[page.index("## The records' fields"):])
    seen: set[str] = set()
    for name in ("rd", "mr"):
        run_dir = orch.runs / name
        for path in run_dir.rglob("*"):
            if not path.is_file():
                continue
            rel = _pattern(path.relative_to(run_dir).as_posix())
            seen.add(rel)
            under = next((d for d in OWN_DIRS if rel.startswith(d)), None)
            if under:
                assert under in listing, f"{under} is not in {PAGE.name}"
            else:  # `attempts/<n>/stdout.log, stderr.log`: one line for two
                second = rel.startswith("attempts/<n>/") and f", {rel.rsplit('/', 1)[-1]}" in listing
                assert rel in listing or second, f"{rel} is not in {PAGE.name}"
        for rel, keys in _records(run_dir).items():
            if rel in TRAINERS_OWN:
                continue
            doc = fields.get(rel) or fields.get(rel.rsplit("/", 1)[-1])
            if doc is None and rel.startswith("attempts/<n>/torchrun/"):
                doc = fields.get("attempts/<n>/torchrun/rank-end.<launch>.<rank>.json")
            assert doc is not None, f"{rel}: no fields section in {PAGE.name}"
            assert keys - doc == set(), f"{rel}: fields not in {PAGE.name}: {sorted(keys - doc)}"
    # The jobs left what the test is about: records of every kind it checks.
    assert {"done.json", "attempts/<n>/exit.json", "attempts/<n>/failure.json", "attempts/<n>/stop.json",
            "attempts/<n>/complete.json", "attempts/<n>/progress.rank-<r>.json",
            "attempts/<n>/armed.rank-<r>.json", "checkpoints/step-<8 digits>/manifest.json"} <= seen, sorted(seen)
