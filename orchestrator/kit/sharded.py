"""One verified commit per step for a multi-rank job: every rank writes its own files, rank 0 commits.

The checkpoint is orch's usual one (``checkpoints/step-<8 digits>/`` with ``manifest.json`` written last,
``{"step", "files": {relpath: {size, sha256}}}``), so everything that reads checkpoints (the policy's
rollback, requeue, ``orch show``) keeps working; the manifest also says ``format``, ``world_size`` and which
rank wrote which file. Layout of one step::

    step-00000040/
      dcp/.metadata, dcp/__<r>_0.distcp   torch.distributed.checkpoint: sharded state, resharded on load
      rank-00001/rng.pt                    per-rank files (RNG): restored only on the same world size
      state.pt, meta.json                  replicated files, written by rank 0
      manifest.json                        written by rank 0, last

The commit (every rank calls :meth:`ShardedCheckpointer.save` at the same step):

1. rank 0 names the tmp dir (``step-N.tmp-<hex>``) and tells the others;
2. each rank writes its files (DCP through a hashing filesystem) and fsyncs each one while hashing it
   back from the page cache; DCP's coordinator writes ``dcp/.metadata``;
3. rank 0 gathers every rank's ``{file: {size, sha256}}`` (or its error), checks that every rank
   reported, without error, and that each listed file has its size; then it writes ``manifest.json``
   LAST (fsynced), fsyncs the dir, renames it into place and fsyncs ``checkpoints/``;
4. rank 0 tells every rank whether the step committed; only then are older steps pruned.

A rank that fails or dies anywhere before step 3 leaves no committed step: Megatron writes its ``latest``
file after a barrier, DCP its ``.metadata`` last; a step here counts only when its manifest lists every
rank's files and each of them verifies.

Verification scales with the job: the controller checks the manifest and the sizes only; at resume each
rank hashes its share of the files (round robin), in parallel, and the ranks agree; a step with a
missing or bit-flipped file is set aside (``.corrupt-``) as a whole and the previous committed step is
used instead: never a partial load.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import torch

from orchestrator import protocol
from orchestrator.kit import commit
from orchestrator.kit import dist as kdist
from orchestrator.kit.checkpoint import (
    CheckpointCorrupt,
    CheckpointError,
    write_file_hashed,
)
from orchestrator.kit.log import log

FORMAT = protocol.SHARDED_FORMAT
SHARDED_DIR = "dcp"
RANK_DIR = "rank-{:05d}"
DCP_METADATA = f"{SHARDED_DIR}/.metadata"


class CommitPoint(enum.StrEnum):
    """Where a commit can be interrupted (fault injection: tests kill a rank at each)."""

    WRITING = "writing"  # inside a rank's first file write
    RANK_FILES = "rank_files"  # a rank's files written and fsynced, not yet reported
    GATHERED = "gathered"  # rank 0: every report in hand, no manifest yet
    MANIFEST = "manifest"  # rank 0: manifest written, the tmp dir not yet renamed
    COMMITTED = "committed"  # rank 0: renamed into place, older steps not yet pruned


PointHook = Callable[[CommitPoint, int], None]


class _CountingStream:
    """What DCP writes a file through: the file itself, counted; ``tell``/``fileno``/``close`` as DCP needs.

    The sha256 is not taken here but from the file once written (``_fsync_and_hash``): hashing each buffer as
    it was written (checkpoint.py's overlapped writer) kept every core busy while the ranks wrote, and the
    sharded save took 1.41x DCP's own (P10, 2 ranks on 2 cores), while the fsync after it left the CPU idle.
    """

    def __init__(self, f: BinaryIO, hook: Callable[[], None] | None) -> None:
        self._f = f
        self._hook = hook
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._hook is not None:
            self._hook()
        n = self._f.write(data)
        self.size += n
        return n

    def tell(self) -> int:
        return self.size

    def fileno(self) -> int:
        self._f.flush()  # DCP fsyncs fileno() before close: Python's buffer must reach the fd first
        return self._f.fileno()

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


def _fsync_and_hash(f: BinaryIO, path: str | os.PathLike[str], written: int) -> str:
    """fsync the just-written file while hashing it back from the page cache, and return its sha256.

    The disk's wait and the hash's CPU overlap (both release the GIL), so the verified save costs about
    max(fsync, sha256) on top of the writes, not their sum; and the digest is of the bytes the file holds,
    read back, not of the buffers handed to ``write``. The fsync's error, if any, is the one raised.
    """
    f.flush()
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-fsync") as pool:
        synced = pool.submit(os.fsync, f.fileno())
        try:
            size, digest = protocol.sha256_file(Path(path))
        finally:
            synced.result()
    if size != written:  # another writer of this path (a second save into one tmp dir) would show here
        raise OSError(f"{path}: {size} bytes on disk after writing {written}")
    return digest


def _hashing_filesystem(hook: Callable[[], None] | None) -> Any:
    """A DCP ``FileSystem`` that records ``{path: {size, sha256}}`` of every file it writes, fsynced."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class HashingFileSystem(FileSystem):
        def __init__(self) -> None:
            super().__init__()
            self.files: dict[str, dict[str, Any]] = {}
            self._lock = threading.Lock()

        @contextlib.contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
            if "w" not in mode:
                with super().create_stream(path, mode) as s:
                    yield s
                return
            with open(path, "xb") as f:
                w = _CountingStream(f, hook)
                yield w
                digest = _fsync_and_hash(f, path, w.size)
            with self._lock:
                self.files[str(path)] = {"size": w.size, "sha256": digest}

        def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
            super().rename(path, new_path)
            with self._lock:
                if str(path) in self.files:
                    self.files[str(new_path)] = self.files.pop(str(path))

    return HashingFileSystem()


def dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Model (and optimizer) state as torch.distributed.checkpoint saves and reshards it (FSDP shards as they are)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    return state


def set_dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict[str, Any]) -> None:
    """Inverse of :func:`dcp_state`, for a ``state`` that :meth:`ShardedCheckpointer.load` filled in place."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optim"])


def is_sharded(path: Path) -> bool:
    """Whether the committed checkpoint at ``path`` was written by :class:`ShardedCheckpointer`."""
    try:
        m = protocol.read_json_bounded(path / protocol.MANIFEST)
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and m.get("format") == FORMAT


class ShardedCheckpointer:
    """Save / resume / load for a job of any number of ranks (a process group, or none).

    ``write_hook(step, path)`` runs before each write of each file (fault injection, as in
    :class:`CheckpointManager`); ``point_hook(point, step)`` at each :class:`CommitPoint`.
    """

    def __init__(self, run_dir: Path | str, keep_last_k: int = 2, *,
                 write_hook: Callable[[int, str], None] | None = None, point_hook: PointHook | None = None) -> None:
        if keep_last_k < 1:
            raise ValueError("keep_last_k must be >= 1")
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / protocol.CHECKPOINTS_DIR
        self.keep_last_k = keep_last_k
        self.write_hook = write_hook
        self.point_hook = point_hook
        self.rank, self.world = kdist.rank(), kdist.world_size()

    # --- collectives (no-ops on one rank) -----------------------------------------------------------
    def _bcast(self, obj: Any) -> Any:
        d = kdist._dist()
        if d is None:
            return obj
        box = [obj]
        d.broadcast_object_list(box, src=0)
        return box[0]

    def _gather(self, obj: Any) -> list[Any] | None:
        d = kdist._dist()
        if d is None:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        d.gather_object(obj, out, dst=0)
        return out

    def _any(self, flag: bool) -> bool:
        return kdist.any_rank(flag)

    def _point(self, point: CommitPoint, step: int) -> None:
        if self.point_hook is not None:
            self.point_hook(point, step)

    # --- saving -------------------------------------------------------------------------------------
    def save(self, step: int, *, sharded: dict[str, Any] | None = None, replicated: Mapping[str, Any] | None = None,
             per_rank: Mapping[str, Any] | None = None) -> Path:
        """Commit step ``step``: collective, every rank calls it. Raises :class:`CheckpointError` on every
        rank when any rank failed (no commit; the previous steps are untouched).

        ``sharded``: a DCP state dict (``torch.distributed.checkpoint.state_dict.get_state_dict``); every
        rank passes its own. ``replicated``: ``{file name: object}`` the same on every rank, written by
        rank 0. ``per_rank``: ``{file name: object}`` of this rank (its RNG states).
        """
        final = self.root / protocol.checkpoint_name(step)
        decision = None
        if self.rank == 0:
            decision = self._prepare(final)
        decision = self._bcast(decision)
        if decision == "committed":
            return final
        tmp = self.root / decision
        report, failed = self._write_own(step, tmp, replicated, per_rank)
        # DCP's save is collective: when one rank's own files failed, no rank enters it (it would wait for that
        # rank). Only plain files can fail before it, so a sharded-only save skips this all-reduce.
        plain = per_rank is not None or replicated is not None
        if sharded is not None and not (plain and self._any(failed)):
            try:
                self._write_sharded(step, tmp, sharded, report)
            except Exception as e:  # DCP raises on every rank when any rank's write failed
                report = {"rank": self.rank, "error": repr(e)[:800], "errno": protocol.storage_errno(e)}
        if "error" not in report:
            self._point(CommitPoint.RANK_FILES, step)
        reports = self._gather(report)
        verdict: tuple[str, int | None] | None = None
        if self.rank == 0:
            assert reports is not None
            try:
                verdict = self._commit(step, tmp, final, reports, expect_dcp=sharded is not None)
            except Exception as e:  # every rank must hear the verdict, or they wait in the broadcast
                shutil.rmtree(tmp, ignore_errors=True)
                verdict = f"commit of step {step} failed on rank 0: {e!r}", protocol.storage_errno(e)
        verdict = self._bcast(verdict)
        if verdict is not None:
            # Every rank raises the storage error a rank hit (an EIO in one rank's write was a crash; the
            # attempt's class comes from it: storage, or enospc), else the verdict as it was.
            why, code = verdict
            cause = OSError(code, why) if code is not None else RuntimeError(why)
            raise CheckpointError(step, cause, 0) from cause
        if self.rank == 0:
            self._point(CommitPoint.COMMITTED, step)
            try:
                self.prune()
            except OSError as e:  # committed; a failed prune only costs disk
                log(f"prune after step {step} failed: {e!r}")
        return final

    def _prepare(self, final: Path) -> str:
        """Rank 0: "committed" when ``final`` already verifies (sizes), else the tmp dir's name, created."""
        self.root.mkdir(parents=True, exist_ok=True)
        if final.exists() or final.is_symlink():
            if protocol.verify_checkpoint(final, hashes=False) is None:
                return "committed"  # e.g. a stop right after the periodic save of the same step
            aside = final.with_name(f"{final.name}.corrupt-{os.urandom(4).hex()}")
            os.rename(final, aside)
            protocol.fsync_dir(self.root)
        tmp = self.root / protocol.tmp_name(final.name)
        tmp.mkdir()
        return tmp.name

    def _hook(self, step: int, path: Path) -> Callable[[], None]:
        first = [True]

        def hook() -> None:
            if first[0]:
                first[0] = False
                self._point(CommitPoint.WRITING, step)
            if self.write_hook is not None:
                self.write_hook(step, str(path))

        return hook

    def _write_own(self, step: int, tmp: Path, replicated: Mapping[str, Any] | None,
                   per_rank: Mapping[str, Any] | None) -> tuple[dict[str, Any], bool]:
        """This rank's plain files: per-rank ones, and the replicated ones on rank 0."""
        files: dict[str, Any] = {}
        try:
            if per_rank:
                d = tmp / RANK_DIR.format(self.rank)
                d.mkdir()
                for name, obj in per_rank.items():
                    files[f"{d.name}/{name}"] = write_file_hashed(d / name, obj, self._hook(step, d / name))
                protocol.fsync_dir(d)
            if self.rank == 0 and replicated:
                for name, obj in replicated.items():
                    files[name] = write_file_hashed(tmp / name, obj, self._hook(step, tmp / name))
            return {"rank": self.rank, "files": files}, False
        except Exception as e:  # reported to rank 0, which then commits nothing
            return {"rank": self.rank, "error": repr(e)[:800], "errno": protocol.storage_errno(e)}, True

    def _write_sharded(self, step: int, tmp: Path, state: dict[str, Any], report: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        root = tmp / SHARDED_DIR
        writer = dcp.FileSystemWriter(root, sync_files=False)  # the hashing filesystem fsyncs each file itself
        fs = _hashing_filesystem(self._hook(step, root))
        writer.fs = fs
        dcp.save(state, storage_writer=writer)
        for p, meta in fs.files.items():
            report["files"][Path(p).relative_to(tmp).as_posix()] = meta
        protocol.fsync_dir(root)

    def _commit(self, step: int, tmp: Path, final: Path, reports: list[Any], *,
                expect_dcp: bool) -> tuple[str, int | None] | None:
        """Rank 0: the manifest, last, only when every rank reported every file; None, or why not (and the storage
        errno a rank reported, if any: ``protocol.storage_errno``)."""
        problem = _check_reports(tmp, reports, self.world, expect_dcp)
        if problem is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            log(f"step {step} not committed: {problem}")
            codes = [r.get("errno") for r in reports if isinstance(r, dict) and isinstance(r.get("errno"), int)]
            return problem, (codes[0] if codes else None)
        self._point(CommitPoint.GATHERED, step)
        files: dict[str, Any] = {}
        ranks: dict[str, list[str]] = {}
        for r in reports:
            files.update(r["files"])
            ranks[str(r["rank"])] = sorted(r["files"])
        manifest = {"step": int(step), "format": FORMAT, "world_size": self.world, "ranks": ranks, "files": files}
        try:
            protocol.write_file_synced(tmp / protocol.MANIFEST,
                                       [json.dumps(manifest, indent=1, sort_keys=True).encode()])
            protocol.fsync_dir(tmp)
            self._point(CommitPoint.MANIFEST, step)
            os.rename(tmp, final)
            protocol.fsync_dir(self.root)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            return f"commit of step {step} failed: {e!r}", protocol.storage_errno(e)
        return None

    def prune(self) -> list[str]:
        """Committed steps beyond the newest ``keep_last_k``, renamed aside first (rank 0, after a commit)."""
        return commit.prune(self.run_dir, self.keep_last_k)

    # --- resuming -----------------------------------------------------------------------------------
    def resume(self, choose: Callable[[], tuple[int, Path] | None]) -> tuple[int, Path] | None:
        """Every rank: the step to resume from, every file of it verified by some rank, or None.

        ``choose`` runs on rank 0 only and names the candidate from the manifest and sizes (``Run.
        resume_checkpoint(hashes=False)``: the policy's rollback override included). Each rank then hashes
        its share of the files; if any rank finds a missing or changed file, rank 0 sets the whole step
        aside (``.corrupt-``) and the next older candidate is tried: never a partial load.
        """
        while True:
            found: Any = None
            if self.rank == 0:
                try:
                    found = choose()
                except Exception as e:  # told to every rank, which raise it too (none waits)
                    found = ("error", repr(e))
            found = self._bcast(found)
            if found is None:
                return None
            if found[0] == "error":
                from orchestrator.kit.run import RunDirError

                raise RunDirError(f"choosing the checkpoint to resume from failed on rank 0: {found[1]}")
            step, path = found[0], Path(found[1])
            problem = self.verify_share(path)
            problems = self._all_problems(problem)
            if not problems:
                return step, path
            if self.rank == 0:
                log(f"{path.name} does not verify ({'; '.join(problems)}): set aside, trying the previous step")
                aside = path.with_name(f"{path.name}.corrupt-{os.urandom(4).hex()}")
                with contextlib.suppress(FileNotFoundError):
                    os.rename(path, aside)
                    protocol.fsync_dir(path.parent)

    def _all_problems(self, problem: str | None) -> list[str]:
        d = kdist._dist()
        if d is None:
            return [problem] if problem else []
        out: list[Any] = [None] * self.world
        d.all_gather_object(out, problem)
        return [p for p in out if p]

    def verify_share(self, path: Path) -> str | None:
        """Hash this rank's share of the step's files (every ``world``-th, from ``rank``); why not, or None."""
        try:
            m = protocol.read_json_bounded(path / protocol.MANIFEST)
            files = m["files"]
            names = sorted(files)
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"{path.name}: unreadable manifest ({e!r})"
        for name in names[self.rank::self.world]:
            try:
                p = protocol.resolve_inside(path, name)
                size, digest = protocol.sha256_file(p)
            except (OSError, ValueError, protocol.UnsafePath) as e:
                return f"{path.name}/{name}: {e!r}"
            meta = files[name]
            if not isinstance(meta, dict) or size != meta.get("size") or digest != meta.get("sha256"):
                return f"{path.name}/{name} does not match its manifest entry"
        return None

    # --- loading ------------------------------------------------------------------------------------
    def load(self, path: Path, *, sharded: dict[str, Any] | None = None,
             map_location: str | torch.device = "cpu") -> dict[str, Any]:
        """Load a step :meth:`resume` verified: DCP state into ``sharded`` in place (resharded to this world
        size); returns the replicated files and, on the world size that saved it, this rank's own."""
        m = protocol.read_json_bounded(path / protocol.MANIFEST)
        out: dict[str, Any] = {}
        mine = RANK_DIR.format(self.rank) + "/"
        same_world = m.get("world_size") == self.world
        for name in m["files"]:
            if name.startswith(SHARDED_DIR + "/"):
                continue
            if name.startswith("rank-"):
                if not (same_world and name.startswith(mine)):
                    continue
                key = name[len(mine):]
            else:
                key = name
            p = path / name
            try:
                out[key] = json.loads(p.read_bytes()) if name.endswith(".json") else \
                    torch.load(p, map_location=map_location, weights_only=True)
            except Exception as e:  # verified bytes that do not unpickle: corrupt
                raise CheckpointCorrupt(f"{path.name}/{name} verifies but does not load: {e!r}") from e
        if sharded is not None:
            if DCP_METADATA not in m["files"]:
                raise CheckpointCorrupt(f"{path.name} holds no sharded state")
            import torch.distributed.checkpoint as dcp

            dcp.load(sharded, checkpoint_id=path / SHARDED_DIR)
        return out


def _check_reports(tmp: Path, reports: list[Any], world: int, expect_dcp: bool) -> str | None:
    """Why the gathered reports do not make a complete step, or None."""
    got = sorted(r.get("rank") for r in reports if isinstance(r, dict) and isinstance(r.get("rank"), int))
    if got != list(range(world)):
        return f"ranks reported: {got}, expected 0..{world - 1}"
    errors = [f"rank {r['rank']}: {r['error']}" for r in reports if "error" in r]
    if errors:
        return "; ".join(errors)
    seen: set[str] = set()
    for r in reports:
        for name, meta in r["files"].items():
            if name in seen:
                return f"{name} reported by two ranks"
            seen.add(name)
            p = tmp / name
            # Missing/short after the rank reported it: a shared filesystem that lost it.
            if not p.is_file() or p.stat().st_size != meta["size"]:
                return f"{name}, reported by rank {r['rank']}, is not on disk with its size"
    if not seen:
        return "no rank wrote a file"
    if expect_dcp and DCP_METADATA not in seen:
        return f"{DCP_METADATA} was not written"
    return None
