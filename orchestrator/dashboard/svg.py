"""The loss curve as inline SVG, drawn on the server: no chart library and no CDN (clusters are often offline), and
nothing for the page's Content-Security-Policy to allow. The same series and marks as ``orch plot``
(``views.losscurve``); every text it writes goes through ``escape``."""

from __future__ import annotations

import math
import time
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


TIMELINE_ORDER = ("waiting", "startup", "useful", "save_stall", "lost_work", "hang_detection", "teardown",
                  "failed_attempt")
ROW_H, LABEL_W = 22, 150


def timeline_svg(goodput: dict[str, Any] | None) -> str:
    """The attempts one after another on one time axis (a Gantt chart): for each, the wait before it (queued, or
    waiting after the previous attempt's end) and its held time split as ``orch show`` splits it (startup, useful,
    saving, lost work, hang detection, stopping, a failed attempt), each part as wide as its share of the whole
    and titled with its seconds; the cause of each end at the row's left. An empty string before anything was
    held or waited."""
    attempts = (goodput or {}).get("attempts") or []
    waits = (goodput or {}).get("waits") or []
    rows = []
    for i, a in enumerate(attempts):
        parts = [("waiting", waits[i]["seconds"] if len(waits) == len(attempts) else 0.0)]
        parts += [(k, (a.get("seconds") or {}).get(k, 0.0)) for k in TIMELINE_ORDER[1:]]
        rows.append((a.get("n"), a.get("cause") or "ok", [(k, float(v)) for k, v in parts if v and v > 0]))
    total = sum(v for _, _, parts in rows for _, v in parts)
    if not rows or not total > 0:
        return ""
    width = WIDTH - LABEL_W - PAD_R
    height = ROW_H * len(rows) + PAD_B
    out = [f'<svg class="timeline" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="attempts over time">']
    x = 0.0
    for r, (n, cause, parts) in enumerate(rows):
        y = r * ROW_H + 4
        out.append(f'<text x="4" y="{y + 12}">attempt {int(n or 0)}: {escape(str(cause))}</text>')
        for k, v in parts:
            w = v / total * width
            out.append(f'<rect class="tl-{k}" x="{LABEL_W + x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" '
                       f'height="{ROW_H - 8}"><title>{escape(k)}: {v:.1f} s</title></rect>')
            x += w
    out.append(f'<text x="{LABEL_W}" y="{height - 8}">0</text>'
               f'<text x="{WIDTH - PAD_R}" y="{height - 8}" text-anchor="end">{total:.0f} s</text>')
    out.append("</svg>")
    return "".join(out)


MAX_GROUPS = 8  # lines on one chart: the groups that held the most; the rest are named below it


def goodput_svg(over: dict[str, Any]) -> str:
    """Goodput over time, one line per group (``views.goodputview.goodput_over_time``): y the useful share of the
    held time, 0-100 %, x the buckets; a bucket in which a group held nothing breaks its line. Each point is titled
    with its time, goodput and held hours. An empty string when nothing was held."""
    groups = {g: vals for g, vals in over.get("groups", {}).items() if any(v is not None for v in vals)}
    if not groups:
        return ""
    held = over.get("held_s", {})
    shown = sorted(groups, key=lambda g: -sum(held.get(g, [])))[:MAX_GROUPS]
    n = max(len(v) for v in groups.values())
    start, width = float(over["start"]), float(over["width_s"])
    hidden = [g for g in groups if g not in shown]
    legend_h = 16 * (len(shown) + bool(hidden))
    height = HEIGHT + legend_h
    plot_w, plot_h = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B

    def xy(i: int, g: float) -> tuple[float, float]:
        return PAD_L + (i + 0.5) / n * plot_w, PAD_T + (1 - g) * plot_h

    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))

    out = [f'<svg class="curve goodput" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="goodput over time">',
           f'<line class="axis" x1="{PAD_L}" y1="{HEIGHT - PAD_B}" x2="{WIDTH - PAD_R}" y2="{HEIGHT - PAD_B}"/>',
           f'<line class="axis" x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{HEIGHT - PAD_B}"/>',
           f'<text x="{PAD_L}" y="{HEIGHT - 8}">{when(start)} UTC</text>',
           f'<text x="{WIDTH - PAD_R}" y="{HEIGHT - 8}" text-anchor="end">{when(start + n * width)}</text>',
           f'<text x="{PAD_L - 4}" y="{PAD_T + 10}" text-anchor="end">100 %</text>',
           f'<text x="{PAD_L - 4}" y="{HEIGHT - PAD_B}" text-anchor="end">0 %</text>']
    for k, g in enumerate(shown):
        vals, hs = groups[g], held.get(g, [])
        runs: list[list[tuple[float, float]]] = [[]]
        for i, v in enumerate(vals):
            if v is None:
                runs.append([])
                continue
            runs[-1].append(xy(i, v))
            x, y = xy(i, v)
            h = hs[i] / 3600 if i < len(hs) else 0.0
            out.append(f'<circle class="a{k % 6}" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="none"><title>'
                       f'{escape(g)}, {when(start + i * width)}: {100 * v:.1f} % of {h:.2f} h held</title></circle>')
        for run in runs:
            if len(run) > 1:
                out.append(f'<polyline class="series a{k % 6}" points="'
                           f'{" ".join(f"{x:.1f},{y:.1f}" for x, y in run)}"><title>{escape(g)}</title></polyline>')
        ly = HEIGHT + 16 * k + 4
        out.append(f'<line class="series a{k % 6}" x1="{PAD_L}" y1="{ly}" x2="{PAD_L + 24}" y2="{ly}"/>'
                   f'<text x="{PAD_L + 30}" y="{ly + 4}">{escape(g)}</text>')
    if hidden:
        out.append(f'<text x="{PAD_L}" y="{HEIGHT + 16 * len(shown) + 8}">and {len(hidden)} more, held less: '
                   f'{escape(", ".join(sorted(hidden)[:20]))}{" …" if len(hidden) > 20 else ""}</text>')
    out.append("</svg>")
    return "".join(out)
