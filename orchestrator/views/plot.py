"""Drawing a ``losscurve.loss_curve`` to an image with matplotlib (the optional ``plot`` extra).

matplotlib is imported inside ``draw`` only, through its object API and the Agg canvas (no pyplot:
no global figure state, no display needed on a login node). Each mark kind has one colour used by
nothing else in the picture, so a person (and a test reading the PNG back) can find it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError

MARK_STYLE: dict[str, dict[str, Any]] = {
    "preemption": {"color": "#ff00ff", "marker": "v", "label": "preemption"},
    "rollback": {"color": "#e00000", "marker": "X", "label": "NaN rollback"},
    "failure": {"color": "#ff8c00", "marker": "s", "label": "failure"},
}
RESUME_COLOR = "#00c800"  # a dashed vertical line at each resume step
SERIES_COLORS = ("#1f77b4", "#17becf", "#7f7f7f", "#9467bd", "#8c564b")  # none near a mark colour
INSTALL_HINT = "pip install 'orch[plot]'"


def draw(curve: dict[str, Any], path: Path, width_px: int = 1000, height_px: int = 500) -> Path:
    """Write the picture of ``curve`` to ``path`` (format from its suffix), atomically: a reader sees
    the old file or the new one, never half a PNG. Raises UsageError without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(f"orch plot needs matplotlib: {INSTALL_HINT}") from None

    dpi = 100
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    attempts = sorted({s["attempt"] for s in curve["series"]})
    labelled: set[str] = set()
    for s in curve["series"]:
        color = SERIES_COLORS[attempts.index(s["attempt"]) % len(SERIES_COLORS)]
        label = f"attempt {s['attempt']}"
        steps, losses = zip(*s["points"], strict=True)
        ax.plot(steps, losses, color=color, linewidth=1.5, label=None if label in labelled else label, zorder=2)
        labelled.add(label)
    lows = [p[1] for s in curve["series"] for p in s["points"]]
    floor = min(lows) if lows else 0.0
    for m in curve["marks"]:
        if m["kind"] == "resume":
            ax.axvline(m["step"], color=RESUME_COLOR, linestyle=(0, (4, 2)), linewidth=1.5, zorder=1,
                       label=None if "resume" in labelled else "resume")
            labelled.add("resume")
            continue
        style = MARK_STYLE[m["kind"]]
        y = m["loss"] if m["loss"] is not None else floor
        ax.plot([m["step"]], [y], linestyle="none", marker=style["marker"], markersize=11, color=style["color"],
                markeredgecolor=style["color"], zorder=3,
                label=None if style["label"] in labelled else style["label"])
        labelled.add(style["label"])
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, color="#dddddd", linewidth=0.6)
    n = len({m["attempt"] for m in curve["marks"]} | set(attempts))
    ax.set_title(f"{curve['name']}: loss over {n} attempt{'s' if n != 1 else ''} ({curve['state']})")
    if not curve["series"]:
        ax.text(0.5, 0.5, "no loss recorded yet", transform=ax.transAxes, ha="center", va="center")
    # The legend goes below the axes, so it never covers a mark.
    if labelled:
        fig.legend(loc="lower center", ncol=min(6, len(labelled)), frameon=False)
    fig.subplots_adjust(left=0.08, right=0.97, top=0.92, bottom=0.2)
    fmt = path.suffix.lstrip(".").lower() or "png"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, format=fmt, dpi=dpi)
        os.replace(tmp, path)
    except ValueError as e:  # an image format matplotlib does not know
        raise UsageError(f"cannot write {path.name}: {e}") from None
    except OSError as e:  # `-o /proc/x.png` ended in a FileNotFoundError traceback (exit 1): a usage error
        raise UsageError(f"cannot write {str(path)[:200]}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return path
