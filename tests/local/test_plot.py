"""`orch plot`: the loss curve across attempts of a real trainer job that was preempted (a real SIGTERM)
and then hit a NaN (rolled back by the policy); the PNG is read back and its marks found by colour."""

from __future__ import annotations

import os
import stat
import sys

import numpy as np
import pytest
from PIL import Image

TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny"]
# Attempt 1 gets SIGTERM in step 12 (saves step 11: preempted), attempt 2 resumes at 11 and hits NaN
# at step 25 (the policy rolls back to the checkpoint of step 20), attempt 3 resumes at 20 and ends.
FAULTS = ["--max-steps", "60", "--save-interval", "5", "--heartbeat-interval", "0.02",
          "--inject-fault", "sigterm@step=12", "--inject-fault", "nan@step=25"]
EXPECTED_MARKS = [
    {"kind": "preemption", "attempt": 1, "step": 11, "class": "preempted"},
    {"kind": "resume", "attempt": 2, "step": 11},
    {"kind": "rollback", "attempt": 2, "step": 25, "class": "nan", "to_step": 20},
    {"kind": "resume", "attempt": 3, "step": 20},
]


@pytest.fixture
def three_attempts(orch):
    p = orch("submit", "--name", "curve", "--wait", "--", *TRAINER, *FAULTS, timeout=240)
    assert p.returncode == 0, p.stderr
    assert [a["failure_class"] for a in orch.show("curve")["attempts"]] == ["preempted", "nan", None]
    return orch


def test_plot_json_lists_every_attempts_curve_and_the_marked_points(three_attempts):
    orch = three_attempts
    d = orch.json("plot", "curve")
    marks = [{k: v for k, v in m.items() if k != "loss"} for m in d["marks"]]
    assert marks == EXPECTED_MARKS
    assert all(isinstance(m["loss"], float) for m in d["marks"])
    assert [s["attempt"] for s in d["series"]] == [1, 2, 3]
    steps = {s["attempt"]: [p[0] for p in s["points"]] for s in d["series"]}
    assert steps[1][-1] == 11 and steps[2][0] > 11 and steps[2][-1] < 25 and steps[3][0] > 20 and steps[3][-1] == 60
    assert all(a < b for s in steps.values() for a, b in zip(s, s[1:], strict=False))
    # The preemption mark sits on attempt 1's last loss; the resume after it continues from there.
    pre, res = d["marks"][0], d["marks"][1]
    assert pre["loss"] == d["series"][0]["points"][-1][1] == res["loss"]


def test_plot_png_has_the_size_asked_and_each_mark_where_its_step_is(three_attempts, tmp_path):
    orch = three_attempts
    out = tmp_path / "curve.png"
    p = orch("plot", "curve", "-o", out, "--size", "1200x600", check=True)
    assert p.stdout.startswith(f"{out}: ") and "3 attempts, 4 marked" in p.stdout
    img = Image.open(out)
    assert (img.format, img.size) == ("PNG", (1200, 600))
    px = np.asarray(img.convert("RGB")).astype(int)
    r, g, b = px[..., 0], px[..., 1], px[..., 2]

    # Resume points: dashed vertical green lines over the whole height of the axes.
    green = (g > 150) & (r < 80) & (b < 80)
    cols = np.flatnonzero(green.sum(axis=0) > 0.3 * px.shape[0])
    lines = [c for c in _groups(cols)]
    assert len(lines) == 2, f"resume lines at columns {cols}"
    x_res1, x_res2 = (np.mean(c) for c in lines)
    rows = np.flatnonzero(green[:, lines[0]].any(axis=1))
    top, bottom = rows.min(), rows.max()  # the axes; the legend lies below them

    def blob_x(mask: np.ndarray) -> float:
        ys, xs = np.nonzero(mask[top:bottom + 1])
        assert xs.size > 20, "mark not drawn inside the axes"
        assert xs.max() - xs.min() < 30, "more than one mark of this colour"
        return float(xs.mean())

    x_pre = blob_x((r > 200) & (b > 200) & (g < 80))  # preemption: magenta
    x_nan = blob_x((r > 200) & (g < 60) & (b < 60))  # NaN rollback: red
    assert abs(x_pre - x_res1) < 6  # preempted at step 11, resumed at step 11
    assert x_res1 < x_res2 < x_nan  # 11 < 20 (rolled back to) < 25 (the NaN)
    # x is linear in the step: the NaN at 25 is 14/9 as far from step 11 as the resume at 20.
    assert (x_nan - x_pre) / (x_res2 - x_pre) == pytest.approx(14 / 9, rel=0.1)
    # Each mark colour also shows once in the legend, below the axes.
    legend = px[bottom + 1:]
    for colour in ((255, 0, 255), (224, 0, 0), (0, 200, 0)):
        assert (np.abs(legend - colour).sum(axis=2) < 30).any(), colour


def _groups(cols: np.ndarray) -> list[list[int]]:
    out: list[list[int]] = []
    for c in cols:
        if out and c - out[-1][-1] <= 2:
            out[-1].append(int(c))
        else:
            out.append([int(c)])
    return out


def _job_writing(orch, name: str, beats: str) -> dict:
    """Submit a job whose program writes the heartbeats ``beats`` (Python over ``p``, the protocol, ``rd`` and
    ``n``) and completes; its ``orch plot --json``."""
    job = ("import os; from orchestrator import protocol as p; rd, n = os.environ['ORCH_RUN_DIR'], "
           "int(os.environ['ORCH_ATTEMPT'])\n" + beats + "\nos.makedirs('result'); open('result/x', 'w').write('x')")
    p = orch("submit", "--name", name, "--wait", "--outputs", "result/*", "--", sys.executable, "-c", job, timeout=60)
    assert p.returncode == 0, p.stderr
    return orch.json("plot", name)


def test_in_place_restart_within_one_attempt_is_a_resume_mark(orch):
    # One attempt whose steps go back (what a Slurm in-place requeue resuming a checkpoint leaves).
    d = _job_writing(orch, "inplace",
                     "for s in (1, 2, 3, 4, 5, 3, 4, 6): p.write_progress(rd, n, step=s, loss=10.0 - s)")
    assert [s["points"] for s in d["series"]] == [[[1, 9.0], [2, 8.0], [3, 7.0], [4, 6.0], [5, 5.0]],
                                                  [[3, 7.0], [4, 6.0], [6, 4.0]]]
    assert d["marks"] == [{"kind": "resume", "attempt": 1, "step": 3, "loss": 7.0, "in_place": True}]
    # A rerun that resumed at the very step the first run saved on its SIGTERM: no step goes back, but its
    # resumed_from changes (issue 45: `orch plot` marked no resume of a Slurm in-place requeue like this one).
    d = _job_writing(orch, "inplace-same", "for s, r in ((0, 0), (1, 0), (2, 0), (3, 0), (3, 3), (4, 3), (5, 3)):\n"
                     "    p.write_progress(rd, n, step=s, loss=10.0 - s, resumed_from=r)")
    assert [len(s["points"]) for s in d["series"]] == [4, 3], d["series"]
    assert d["marks"] == [{"kind": "resume", "attempt": 1, "step": 3, "loss": 7.0, "in_place": True}]


def test_plot_without_matplotlib_is_one_line_exit_2_and_writes_nothing(orch, tmp_path):
    # A matplotlib that cannot be imported, first on the path: what a login node without the extra sees.
    fake = tmp_path / "nompl" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    orch("submit", "--name", "nompl", "--wait", "--", "bash", "-c", "exit 0", timeout=60)
    env = {"PYTHONPATH": f"{fake.parent}:{orch.env['PYTHONPATH']}"}
    out = tmp_path / "x.png"
    p = orch("plot", "nompl", "-o", out, env=env)
    assert (p.returncode, p.stdout, p.stderr) == (2, "", "orch: orch plot needs matplotlib: pip install 'orch[plot]'\n")
    assert not out.exists() and not list(tmp_path.glob(".x.png*"))
    assert orch("plot", "nompl", "--json", env=env).returncode == 0  # the data needs no matplotlib


def test_plot_refusals(orch, tmp_path):
    p = orch("plot", "nope")
    assert (p.returncode, p.stderr) == (2, "orch: no job named 'nope'\n")
    orch("submit", "--name", "r1", "--", "bash", "-c", "exit 0", check=True)
    p = orch("plot", "r1", "-o", tmp_path / "missing" / "x.png")
    assert (p.returncode, p.stderr) == (2, f"orch: no such directory: {tmp_path / 'missing'}\n")
    p = orch("plot", "r1", "--size", "10x10")
    assert p.returncode == 2 and "want WIDTHxHEIGHT in pixels" in p.stderr
    assert not list(tmp_path.rglob("*.png"))


def test_plot_never_replaces_a_device_node_or_a_symlink(orch, tmp_path):
    # Found by a hostile test: `-o /dev/stdout` as root renamed a PNG over the system's /dev/stdout.
    orch("submit", "--name", "dv", "--wait", "--", "bash", "-c", "exit 0", timeout=60)
    target = tmp_path / "keep.txt"
    target.write_text("mine\n")
    link = tmp_path / "ln.png"
    link.symlink_to(target)
    fifo = tmp_path / "f.png"
    os.mkfifo(fifo)
    for path in (link, fifo):
        p = orch("plot", "dv", "-o", path)
        assert (p.returncode, p.stderr) == (2, f"orch: -o {path}: not a regular file; name a new file or an image "
                                               "to replace\n")
    assert link.is_symlink() and target.read_text() == "mine\n" and stat.S_ISFIFO(os.lstat(fifo).st_mode)
