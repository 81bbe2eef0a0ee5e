"""The run-directory protocol: the one thing the trainer and the orchestrator share (stdlib only).

The commit rule: a marker (``done.json``, a checkpoint's ``manifest.json``) exists under its final
name only after every file it lists was fsynced, the marker itself was written to a same-directory
temporary file, fsynced, renamed into place with ``os.replace``, and the directory fsynced.
*Verified* means the marker parses and every listed file exists, is a regular file inside the run
dir (no symlinks, no ``..``), and has the listed size and sha256.

``verify_done_marker`` is THE completion predicate. The trainer's "already complete" guard,
``orch submit``'s refusal, ``orch requeue`` and ``orch reconcile`` all call it; nothing else in the
code base may decide that a run is finished (seed 000: a "directory is non-empty" guard and a
"result.json exists" requeue disagreed exactly on the state a failure leaves behind).

Every run-dir file name is spelled here and nowhere else. Records a job can write are read through
``durable.read_json_bounded`` and validated field by field: a job's files are evidence, never
instructions (a FIFO, a NaN or a 10**30 in them must cost that job a "bad record", not the pass).

Importable by any training script (no torch, no database, no orchestrator imports but ``durable``).
"""

from orchestrator.protocol.completion import *  # noqa: F403
from orchestrator.protocol.durable import (  # noqa: F401 - the protocol's public API, in one namespace
    MAX_DB_INT,
    MAX_INT,
    MAX_JSON_BYTES,
    TMP_INFIX,
    BadRecord,
    HashingWriter,
    SyncBatch,
    atomic_create,
    atomic_write,
    atomic_write_json,
    finite_number,
    fsync_dir,
    is_int,
    read_bounded,
    read_json_bounded,
    read_tail,
    sha256_file,
    tmp_name,
    write_file_synced,
)
from orchestrator.protocol.exitrecord import *  # noqa: F403
from orchestrator.protocol.failure import *  # noqa: F403
from orchestrator.protocol.fence import *  # noqa: F403
from orchestrator.protocol.layout import *  # noqa: F403
from orchestrator.protocol.layout import (  # noqa: F401 - names the star import does not carry
    _NAME_RE,
)
from orchestrator.protocol.marker import *  # noqa: F403
from orchestrator.protocol.progress import *  # noqa: F403
from orchestrator.protocol.rankrestarts import *  # noqa: F403
from orchestrator.protocol.restarts import *  # noqa: F403
from orchestrator.protocol.runconfig import *  # noqa: F403
from orchestrator.protocol.rundirreport import *  # noqa: F403
from orchestrator.protocol.stoprecord import *  # noqa: F403
from orchestrator.protocol.trackers import WANDB_MODES, read_trackers, wandb_record, write_tracker  # noqa: F401
