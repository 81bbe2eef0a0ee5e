"""The loss curve as inline SVG, drawn on the server: no chart library and no CDN (clusters are often offline), and
nothing for the page's Content-Security-Policy to allow. The same series and marks as ``orch plot``
(``views.losscurve``); every text it writes goes through ``escape``."""

from __future__ import annotations

import math
from html import escape
from typing import Any

WIDTH, HEIGHT = 760, 260
PAD_L, PAD_R, PAD_T, PAD_B = 56, 12, 12, 28
MARK_COLOURS = {"resume": "#2b7a2b", "rollback": "#b36b00", "preemption": "#1f5fbf", "failure": "#b3261e"}
MAX_POINTS = 2000  # per series: a curve of a million beats is thinned, not sent whole


def _thin(points: list[list[float]]) -> list[list[float]]:
    if len(points) <= MAX_POINTS:
        return points
    every = math.ceil(len(points) / MAX_POINTS)
    return points[::every] + ([points[-1]] if (len(points) - 1) % every else [])


def loss_svg(curve: dict[str, Any]) -> str:
    """An ``<svg>`` element: one polyline per attempt, a marker per resume, rollback, preemption or failure, the
    axes' ranges as text. An empty string when the job reported no loss."""
    series = [(s["attempt"], _thin([p for p in s["points"] if all(map(math.isfinite, p))]))
              for s in curve.get("series", []) if s.get("points")]
    series = [(n, ps) for n, ps in series if ps]
    pts = [p for _, ps in series for p in ps]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1 = x1 if x1 > x0 else x0 + 1
    if not y1 - y0 > 0:  # one loss value: y0 + 1e-9 == y0 from ~1.7e7 on (a diverged run), a division by zero
        y1 = y0 + max(1e-9, abs(y0) * 1e-6)

    def xy(step: float, loss: float) -> str:
        x = PAD_L + (step - x0) / (x1 - x0) * (WIDTH - PAD_L - PAD_R)
        y = PAD_T + (1 - (loss - y0) / (y1 - y0)) * (HEIGHT - PAD_T - PAD_B)
        return f"{x:.1f},{y:.1f}"

    out = [f'<svg class="curve" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="loss by step">',
           f'<line class="axis" x1="{PAD_L}" y1="{HEIGHT - PAD_B}" x2="{WIDTH - PAD_R}" y2="{HEIGHT - PAD_B}"/>',
           f'<line class="axis" x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{HEIGHT - PAD_B}"/>',
           f'<text x="{PAD_L}" y="{HEIGHT - 8}">step {x0:g}</text>',
           f'<text x="{WIDTH - PAD_R}" y="{HEIGHT - 8}" text-anchor="end">{x1:g}</text>',
           f'<text x="{PAD_L - 4}" y="{PAD_T + 10}" text-anchor="end">{y1:.3g}</text>',
           f'<text x="{PAD_L - 4}" y="{HEIGHT - PAD_B}" text-anchor="end">{y0:.3g}</text>']
    for n, ps in series:
        out.append(f'<polyline class="series a{int(n) % 6}" points="{" ".join(xy(*p) for p in ps)}">'
                   f"<title>attempt {int(n)}</title></polyline>")
    for m in curve.get("marks", []):
        if m.get("loss") is None or m.get("step") is None:
            continue
        cx, cy = xy(m["step"], m["loss"]).split(",")
        what = escape(f"{m['kind']} (attempt {m.get('attempt')}, step {m['step']})"
                      + (f": {m['class']}" if m.get("class") else ""))
        colour = MARK_COLOURS.get(m["kind"], "#444")
        out.append(f'<circle cx="{cx}" cy="{cy}" r="4" fill="{colour}"><title>{what}</title></circle>')
    out.append("</svg>")
    return "".join(out)
