"""What a framework resumes from, found in a run dir without importing the framework.

A requeue moves an unverified attempt's outputs to the trash, but HF's default layout puts its
``checkpoint-N`` dirs inside ``output_dir``, which ``--outputs 'out/*'`` names: the next attempt found
nothing to resume from and redid every step. So requeue keeps *resume state*:

* an HF ``checkpoint-<N>`` dir holding ``trainer_state.json`` (HF writes that file last);
* a Lightning ``*.ckpt`` file;
* whatever a ``--keep GLOB`` of the job names;
* what an earlier launch set aside as torn (``<name>.torn-<hex>``): set aside, never thrown away.

A checkpoint of a known layout that would not load (0 bytes; a torch zip without its end-of-central-
directory record; a safetensors file shorter than its header says; an unparsable ``trainer_state.json``;
an HF dir without it) is *torn*: renamed ``<name>.torn-<hex>`` so that the framework's own resume (HF's
``get_last_checkpoint``, a script's ``torch.load``) takes the next one instead of crashing on it at
every attempt. Cheap structural checks only: the controller imports no torch.
"""

from __future__ import annotations

import glob
import json
import os
import re
import stat
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator import protocol

HF_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
HF_TRAINER_STATE = "trainer_state.json"
LIGHTNING_SUFFIX = ".ckpt"
TORN_RE = re.compile(r"\.torn-[0-9a-f]{8}$")
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_SAFETENSORS_SUFFIX = ".safetensors"
_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_EOCD = b"PK\x05\x06"
_EOCD_WINDOW = 22 + 65535  # the end record is 22 bytes plus a comment of at most 64 KiB
_MAX_JSON = 64 << 20
# A bounded walk: a run dir with a dataset of a million files must not stall a launch.
_MAX_DEPTH = 6  # lightning_logs/version_N/checkpoints/*.ckpt under an output dir is 5 deep
_MAX_ENTRIES = 20000
_ORCH_OWN = (protocol.ATTEMPTS_DIR, protocol.CHECKPOINTS_DIR)
# The job's --keep globs live in its resources JSON under this key (no schema change).
KEEP_KEY = "keep"
# What a launch moved to the trash / set aside, in the new attempt's command.json (``orch show``).
TRASHED_KEY = "trashed"
SET_ASIDE_KEY = "set_aside"


def keep_globs(resources: dict | None) -> list[str]:
    """The job's ``--keep`` globs (stored in its resources JSON)."""
    v = (resources or {}).get(KEEP_KEY)
    return [g for g in v if isinstance(g, str)] if isinstance(v, list) else []


def launch_record(run_dir: str | Path, attempt: int) -> dict[str, list]:
    """What the launch of ``attempt`` moved to the trash and set aside, from its command.json."""
    try:
        rec = protocol.read_json_bounded(protocol.attempt_dir(run_dir, attempt) / protocol.COMMAND_FILE,
                                         limit=4 << 20)
    except (OSError, ValueError):
        return {TRASHED_KEY: [], SET_ASIDE_KEY: []}
    rec = rec if isinstance(rec, dict) else {}
    return {k: [x for x in rec.get(k) or [] if isinstance(x, dict)] if isinstance(rec.get(k), list) else []
            for k in (TRASHED_KEY, SET_ASIDE_KEY)}


@dataclass(frozen=True)
class SetAside:
    """A torn checkpoint renamed out of the framework's way (``path`` -> ``as_``), and why."""

    path: str
    as_: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "as": self.as_, "why": self.why}


# ---------------------------------------------------------------------------------------------
# structural checks
# ---------------------------------------------------------------------------------------------
def torch_file_problem(path: Path) -> str | None:
    """Why a torch.save / Lightning file cannot load, or None. A zip (torch >= 1.6) must end with its
    central directory, which a kill mid-write never reaches; a legacy pickle only must not be empty."""
    try:
        with open(path, "rb", opener=_nofollow) as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return "0 bytes"
            head = f.read(4)
            if head != _ZIP_LOCAL:
                return None  # torch's legacy (pre-1.6) format: no cheap check beyond non-empty
            f.seek(max(0, size - _EOCD_WINDOW))
            if _ZIP_EOCD not in f.read():
                return "a torch zip without its central directory (truncated)"
    except OSError as e:
        return f"unreadable: {e.strerror or e}"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot load, or None: its 8-byte header length, the JSON header, and the
    data the header declares must all be there."""
    try:
        with open(path, "rb", opener=_nofollow) as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                return f"{size} bytes: shorter than the safetensors header length"
            (n,) = struct.unpack("<Q", f.read(8))
            if n > _MAX_JSON or 8 + n > size:
                return f"{size} bytes, but its header says {n} header bytes follow"
            header = json.loads(f.read(n))
    except OSError as e:
        return f"unreadable: {e.strerror or e}"
    except ValueError:
        return "an unparsable safetensors header"
    if not isinstance(header, dict):
        return "an unparsable safetensors header"
    end = 0
    for k, v in header.items():
        if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list):
            offs = v["data_offsets"]
            if len(offs) == 2 and all(isinstance(o, int) for o in offs):
                end = max(end, offs[1])
    if 8 + n + end > size:
        return f"{size} bytes, but its header says {8 + n + end}"
    return None


def json_problem(path: Path) -> str | None:
    try:
        with open(path, "rb", opener=_nofollow) as f:
            if os.fstat(f.fileno()).st_size > _MAX_JSON:
                return "too large to be a trainer state"
            doc = json.loads(f.read())
    except OSError as e:
        return f"unreadable: {e.strerror or e}"
    except ValueError:
        return "unparsable JSON"
    return None if isinstance(doc, dict) else "not a JSON object"


def file_problem(path: Path) -> str | None:
    """Why a file of a known format cannot load, or None (unknown formats: None)."""
    name = path.name
    if name.endswith(_SAFETENSORS_SUFFIX):
        return safetensors_problem(path)
    if name.endswith(_TORCH_SUFFIXES):
        return torch_file_problem(path)
    if name == HF_TRAINER_STATE:
        return json_problem(path)
    return None


def hf_checkpoint_problem(path: Path) -> str | None:
    """Why an HF ``checkpoint-N`` dir cannot be resumed from, or None."""
    if not (path / HF_TRAINER_STATE).is_file():
        return f"no {HF_TRAINER_STATE} (HF writes it last: the save never finished)"
    for entry in sorted(path.iterdir()):
        if entry.is_file() and not entry.is_symlink() and (why := file_problem(entry)):
            return f"{entry.name}: {why}"
    return None


def problem(path: Path) -> str | None:
    """Why resume state at ``path`` (an HF checkpoint dir, or a file) cannot load, or None."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        return hf_checkpoint_problem(path) if HF_CHECKPOINT_RE.match(path.name) else None
    return file_problem(path) if stat.S_ISREG(st.st_mode) else None


def _nofollow(p: str, flags: int) -> int:
    """Never through a symlink; O_NONBLOCK: a FIFO put in a file's place must not hang a launch."""
    return os.open(p, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)


# ---------------------------------------------------------------------------------------------
# finding resume state
# ---------------------------------------------------------------------------------------------
def _walk(run_dir: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(run-dir relative path, lstat) of entries below the run dir, orch's own dirs and symlinks not
    entered, at most ``_MAX_DEPTH`` deep and ``_MAX_ENTRIES`` in all."""
    stack: list[tuple[str, int]] = [("", 0)]
    seen = 0
    while stack:
        rel, depth = stack.pop()
        try:
            names = sorted(os.listdir(run_dir / rel if rel else run_dir))
        except OSError:
            continue
        for name in names:
            seen += 1
            if seen > _MAX_ENTRIES:
                return
            child = f"{rel}/{name}" if rel else name
            if not rel and name in _ORCH_OWN:
                continue
            try:
                st = os.lstat(run_dir / child)
            except OSError:
                continue
            yield child, st
            if stat.S_ISDIR(st.st_mode) and depth + 1 < _MAX_DEPTH and not HF_CHECKPOINT_RE.match(name):
                stack.append((child, depth + 1))


def _keep_hits(run_dir: Path, keep: Iterable[str]) -> list[str]:
    """What ``--keep`` globs match below the run dir, never through a symlink (glob follows them: a
    symlinked ``ck/`` would have had orch read and rename files outside the run dir)."""
    hits = []
    for pat in keep:
        for hit in glob.glob(pat, root_dir=run_dir, recursive=True):
            rel = os.path.normpath(hit)
            if rel.split("/")[0] in _ORCH_OWN or rel in hits:
                continue
            try:
                protocol.resolve_inside(run_dir, rel)
            except protocol.UnsafePath:
                continue
            hits.append(rel)
    return hits


def candidates(run_dir: Path, keep: Iterable[str] = ()) -> list[str]:
    """Run-dir relative paths of resume state of a known layout or named by ``--keep``, torn or not."""
    out = []
    for rel, st in _walk(run_dir):
        name = rel.rsplit("/", 1)[-1]
        if (stat.S_ISDIR(st.st_mode) and HF_CHECKPOINT_RE.match(name)) or (
                stat.S_ISREG(st.st_mode) and name.endswith(LIGHTNING_SUFFIX)):
            out.append(rel)
    return out + [h for h in _keep_hits(run_dir, keep) if h not in out]


def kept(run_dir: Path, keep: Iterable[str] = ()) -> set[str]:
    """What a requeue must never move to the trash: resume state (a torn one is set aside in place by the
    launch instead, see ``set_aside_torn``), and what was set aside as torn before."""
    return set(candidates(run_dir, keep)) | {rel for rel, _st in _walk(run_dir) if TORN_RE.search(rel)}


def torn(run_dir: Path, keep: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(path, why) of every resume-state candidate that would not load."""
    out = []
    for rel in candidates(run_dir, keep):
        try:
            why = problem(run_dir / rel)
        except OSError:
            continue
        if why is not None:
            out.append((rel, why))
    return out


def set_aside_torn(run_dir: Path, keep: Iterable[str] = ()) -> list[SetAside]:
    """Rename each torn checkpoint ``<name>.torn-<hex>`` (never deleted): the framework then resumes from
    the next one. Seed: a kill -9 mid-save left a 0-byte ``ckpt.pt`` / a cut ``checkpoint-30``, and every
    next attempt died loading it until the job was ``failed``."""
    done = []
    for rel, why in torn(run_dir, keep):
        src = protocol.resolve_inside(run_dir, rel)
        dest = src.with_name(f"{src.name}.torn-{os.urandom(4).hex()}")
        os.rename(src, dest)
        protocol.fsync_dir(dest.parent)
        done.append(SetAside(rel, str(dest.relative_to(run_dir)), why))
    return done


def clearable(run_dir: Path, rel: str, state: set[str]) -> list[str]:
    """What of ``rel`` may go to the trash without taking resume state with it: ``rel`` itself, nothing
    (it is, or is inside, resume state), or, for a dir holding resume state, its other entries."""
    if rel in state or any(rel.startswith(s + "/") for s in state):
        return []
    if not any(s.startswith(rel + "/") for s in state):
        return [rel]
    path = run_dir / rel
    if path.is_symlink() or not path.is_dir():
        return [rel]
    out = []
    for name in sorted(os.listdir(path)):
        out += clearable(run_dir, f"{rel}/{name}", state)
    return out
