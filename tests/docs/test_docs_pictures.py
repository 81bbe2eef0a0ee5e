"""The site's pictures are drawn at build time from a real run (scripts/docs_pictures.py, mkdocs' hook): a
bundled-trainer job sent a real SIGTERM at step 110 and a NaN at step 210, under orch in a throwaway ORCH_HOME.
The pictures must say what that run's own records say, and the build must leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"


def test_a_strict_build_draws_the_pictures_from_a_real_preempted_run(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # The builder's ORCH_* (a DB URL above all) must not reach the docs' job: it would land in that job table.
    bait = tmp_path / "builder-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")} | {
        "NO_MKDOCS_2_WARNING": "1", "TMPDIR": str(scratch), "ORCH_HOME": str(bait),
        "ORCH_DB_URL": f"sqlite:///{tmp_path / 'builder.db'}"}
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert list(scratch.iterdir()) == [], "the build left its run behind"
    assert not bait.exists() and not (tmp_path / "builder.db").exists(), "the docs' job used the builder's orch"

    run = json.loads((site / "pictures" / "run.json").read_text())
    show, plot = run["show"], run["plot"]
    assert show["state"] == "done_marker_verified"
    assert [a["failure_class"] for a in show["attempts"]] == ["preempted", "nan", None]
    marks = [(m["kind"], m["attempt"]) for m in plot["marks"]]
    assert marks == [("preemption", 1), ("resume", 2), ("rollback", 2), ("resume", 3)]
    assert plot["marks"][0]["step"] < 110 <= plot["marks"][2]["step"] and plot["marks"][2]["to_step"] == 200

    # The loss curve: orch plot's picture, each mark in the one colour views/plot.py gives it.
    loss = (site / "pictures" / "loss-across-preemptions.svg").read_text()
    ET.fromstring(loss)  # well-formed
    for colour in ("#ff00ff", "#e00000", "#00c800"):  # preemption, NaN rollback, resume
        assert colour in loss, colour

    # The goodput split: the title's numbers and the rows are the run's; a category the job has none of is
    # not in the legend.
    texts = ["".join(t.itertext()) for t in ET.fromstring((site / "pictures" / "goodput-split.svg").read_text())
             .iter(f"{SVG}text")]
    g = show["goodput"]
    assert f"curve: goodput {g['goodput']:.0%} of {g['held_s']:.1f} s held; " \
           f"waiting {g['seconds']['waiting']:.1f} s (not held)" in texts, texts
    assert {"attempt 1 (preempted)", "attempt 2 (nan)", "attempt 3 (succeeded)", "the job"} <= set(texts), texts
    held = {k for k, v in g["seconds"].items() if v > 0 and k != "waiting"}
    assert {"useful", "startup", "lost_work"} <= held  # the NaN's redone steps are lost work
    legend = set(texts) & {"useful", "startup", "save_stall", "lost_work", "hang_detection", "teardown",
                           "failed_attempt"}
    assert legend == held, (legend, held)

    # The guides show them.
    for page, picture in (("watching", "loss-across-preemptions.svg"), ("goodput", "goodput-split.svg")):
        assert f'src="../../pictures/{picture}"' in (site / "guides" / page / "index.html").read_text()
