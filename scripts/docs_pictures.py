"""The documentation's pictures, drawn from a real run at build time, never by hand.

One tiny bundled-trainer job runs under orch in a throwaway ORCH_HOME on this machine: it is preempted
(a SIGTERM at step 110: it saves and exits 143), resumed, hits a NaN at step 210 (the policy rolls it back
to its step-200 checkpoint) and ends verified. From it:

- ``loss-across-preemptions.svg``: ``orch plot`` of the job (docs/guides/watching.md);
- ``goodput-split.svg``: the job's held time per attempt, by goodput category, from ``orch show --json``
  (docs/guides/goodput.md);
- ``run.json``: what both were drawn from (``orch show --json`` and ``orch plot --json``), so a test can hold
  the pictures to the run.

Used two ways. As a MkDocs hook (``hooks:`` in mkdocs.yml): every ``mkdocs build`` runs the job and puts the
three files in the site under ``pictures/``; with ``ORCH_DOCS_PICTURES=DIR`` it takes them from DIR instead
(written earlier by this script; the unit tests' quick builds). As a script: ``python scripts/docs_pictures.py
--out DIR`` writes them to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

NAMES = ("loss-across-preemptions.svg", "goodput-split.svg", "run.json")
JOB = "curve"
TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--max-steps", "300", "--save-interval", "25",
           "--heartbeat-interval", "0.05", "--inject-fault", "sigterm@step=110", "--inject-fault", "nan@step=210"]
# One colour per category, held fixed so the picture reads the same from build to build.
CATEGORY_COLORS = {
    "useful": "#2ca02c", "startup": "#1f77b4", "save_stall": "#9467bd", "lost_work": "#d62728",
    "hang_detection": "#ff7f0e", "teardown": "#8c564b", "failed_attempt": "#7f7f7f",
}
RUN_TIMEOUT_S = 600  # the job takes ~30 s on a 2-core CI machine; a stuck one must not stall the build


def _orch(home: Path, *args: str) -> str:
    """Run one orch command against ``home``; its stdout, or a one-line error naming the command. No ORCH_*
    variable of the builder's passes: an ORCH_DB_URL would put the docs' job in the builder's own job table."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")} | {"ORCH_HOME": str(home)}
    tmp = home / "tmp"  # torch's caches (torchinductor_<user>) go with the home, not into the builder's /tmp
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)
    p = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                       env=env, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"docs pictures: `orch {' '.join(args[:2])}` exited {p.returncode}: "
                           f"{(p.stderr or p.stdout).strip()[-500:]}")
    return p.stdout


def draw_goodput(show: dict[str, Any], path: Path) -> None:
    """A stacked bar per attempt of its held seconds by category, the job's total below them."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    g = show["goodput"]
    classes = {a["n"]: a["failure_class"] or a["state"] for a in show["attempts"]}
    rows = [(f"attempt {a['n']} ({classes.get(a['n'], '?')})", a["seconds"]) for a in g["attempts"]]
    rows.append(("the job", {k: v for k, v in g["seconds"].items() if k in CATEGORY_COLORS}))
    fig = Figure(figsize=(9, 1.2 + 0.55 * len(rows)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for y, (_label, seconds) in enumerate(reversed(rows)):
        left = 0.0
        for category, color in CATEGORY_COLORS.items():
            width = seconds.get(category, 0.0)
            if width > 0:
                ax.barh(y, width, left=left, color=color, height=0.6,
                        label=category if y == 0 else None)  # the job's row has every category it holds
                left += width
    ax.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)])
    ax.set_xlabel("held seconds")
    ax.set_title(f"{show['name']}: goodput {g['goodput']:.0%} of {g['held_s']:.1f} s held; "
                 f"waiting {g['seconds'].get('waiting', 0.0):.1f} s (not held)")
    ax.grid(True, axis="x", color="#dddddd", linewidth=0.6)
    fig.legend(loc="lower center", ncol=len(ax.get_legend_handles_labels()[1]), frameon=False)
    fig.subplots_adjust(left=0.2, right=0.97, top=0.85, bottom=0.3)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text: smaller, and a test can read it
        fig.savefig(path, format="svg")


def generate(out: Path) -> dict[str, Any]:
    """Run the job in a throwaway ORCH_HOME and write the three files to ``out``; returns run.json's content."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="orch-docs-pictures-") as home:
        _orch(Path(home), "submit", "--name", JOB, "--wait", "--", *TRAINER)
        _orch(Path(home), "plot", JOB, "-o", str(out / NAMES[0]), "--size", "900x420")
        run = {"show": json.loads(_orch(Path(home), "show", JOB, "--json")),
               "plot": json.loads(_orch(Path(home), "plot", JOB, "--json"))}
    draw_goodput(run["show"], out / NAMES[1])
    (out / NAMES[2]).write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    return run


# --- the MkDocs hook ---------------------------------------------------------------------------------------

_made: tempfile.TemporaryDirectory | None = None


def on_files(files: Any, config: Any) -> Any:
    """Add the pictures to the site as ``pictures/<name>``: from ORCH_DOCS_PICTURES, else from a run now."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    global _made
    given = os.environ.get("ORCH_DOCS_PICTURES")
    if given:
        source = Path(given)
        missing = [n for n in NAMES if not (source / n).is_file()]
        if missing:
            raise PluginError(f"ORCH_DOCS_PICTURES={given} lacks {', '.join(missing)} "
                              "(write them with: python scripts/docs_pictures.py --out DIR)")
    else:
        _made = tempfile.TemporaryDirectory(prefix="orch-docs-pictures-out-")
        source = Path(_made.name)
        try:
            generate(source)
        except (RuntimeError, subprocess.TimeoutExpired, ImportError) as e:
            raise PluginError(str(e).splitlines()[0]) from None
    for name in NAMES:
        files.append(File.generated(config, f"pictures/{name}", content=(source / name).read_bytes()))
    return files


def on_post_build(config: Any) -> None:
    """Remove the run's pictures once the site holds them."""
    global _made
    if _made is not None:
        _made.cleanup()
        _made = None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder to write the pictures to")
    args = parser.parse_args()
    run = generate(args.out)
    print(f"{args.out}: {', '.join(NAMES)} from job {JOB!r} ({len(run['show']['attempts'])} attempts, "
          f"{run['show']['state']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
