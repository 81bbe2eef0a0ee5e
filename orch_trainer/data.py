"""Corpus, char-level encoding, and a data order that is a pure function of (seed, step, micro-batch).

Why a pure function: resume then needs only the step number (no sampler state to save, nothing to
replay), an OOM retry of a step sees exactly the same samples, and ``--skip-batches N`` (an absolute
offset set by the orchestrator's NaN policy: batches skipped since step 0) is one addition.

Why the loader skips bad lines instead of failing: one undecodable or absurdly long line in a
multi-GB corpus should not kill a run hours in; the runbook's bad-data hunt (seed 002, example 5) is
``python -m orch_trainer scan-data PATH``, and the count of skipped lines is in run_config.json.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Vocabulary of the tiny preset: newline + printable ASCII. Fixed (not derived from the corpus) so a
# checkpoint's embedding rows mean the same thing whatever data a later attempt is given.
VOCAB: str = "\n" + "".join(chr(c) for c in range(32, 127))
_ENCODE = bytes.maketrans(VOCAB.encode("ascii"), bytes(range(len(VOCAB))))
_VALID = VOCAB.encode("ascii")
MAX_LINE_CHARS = 10_000  # "absurdly long": a minified blob or a missing newline, not prose
EVAL_FRACTION = 0.1


def generated_corpus(n_lines: int = 3000, seed: int = 1234) -> bytes:
    """A small deterministic English-like corpus (no download, same bytes on every machine)."""
    rng = random.Random(seed)
    subjects = ["the model", "a worker", "the scheduler", "every node", "the trainer", "a checkpoint",
                "the cluster", "one job", "the marker", "our run"]
    verbs = ["writes", "reads", "saves", "restores", "verifies", "schedules", "retries", "finishes",
             "requeues", "loads"]
    objects = ["the weights", "a manifest", "the optimizer state", "every file", "the done marker",
               "a tmp dir", "the data", "its progress", "the last step", "a heartbeat"]
    tails = ["before the deadline.", "after a preemption.", "without losing work.", "on the shared disk.",
             "at every save.", "once per attempt.", "in the right order.", "and then exits."]
    lines = []
    for i in range(n_lines):
        line = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(tails)}"
        if i % 7 == 0:
            line = line[0].upper() + line[1:] + f" Step {rng.randint(1, 9999)}."
        lines.append(line)
    return ("\n".join(lines) + "\n").encode("ascii")


def bad_line_reason(line: bytes, max_chars: int = MAX_LINE_CHARS) -> str | None:
    """Why ``line`` (without its newline) cannot be used, or None. Shared by loader and scan-data."""
    if len(line) > max_chars and len(line.decode("utf-8", "replace")) > max_chars:
        return f"absurdly long ({len(line)} bytes > {max_chars} chars)"
    if not line.translate(None, _VALID):  # fast path: only vocabulary bytes
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not valid UTF-8 (byte {e.start}: {line[e.start:e.start + 1]!r})"
    for col, ch in enumerate(text, 1):
        if ch not in VOCAB:
            return f"cannot encode character U+{ord(ch):04X} at column {col} (vocabulary: printable ASCII)"
    return None  # pragma: no cover - unreachable: non-vocab bytes always decode to a non-vocab char


def iter_bad_lines(data: bytes, max_chars: int = MAX_LINE_CHARS) -> Iterator[tuple[int, str]]:
    """(1-based line number, reason) of every line the loader would skip."""
    for n, line in enumerate(data.split(b"\n"), 1):
        reason = bad_line_reason(line.rstrip(b"\r"), max_chars)
        if reason:
            yield n, reason


@dataclass
class Corpus:
    """Encoded tokens (uint8 ids) plus what the run must record about the data."""

    tokens: torch.Tensor
    sha256: str
    source: str
    lines_total: int
    lines_skipped: int
    skipped_examples: list[str] = field(default_factory=list)

    @property
    def vocab_size(self) -> int:
        return len(VOCAB)


def read_corpus_bytes(path: str | None) -> tuple[bytes, str]:
    """The raw corpus and where it came from; OSError if the file is unreadable (a startup check)."""
    if path is None:
        return generated_corpus(), "generated:tiny"
    return Path(path).read_bytes(), str(path)


def encode_corpus(data: bytes, source: str) -> Corpus:
    """Encode, skipping (and counting) lines that cannot be encoded or are absurdly long."""
    good: list[bytes] = []
    skipped: list[str] = []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline does not start a line
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip(b"\r")
        reason = bad_line_reason(line)
        if reason:
            skipped.append(f"line {n}: {reason}")
        else:
            good.append(line)
    encoded = (b"\n".join(good) + b"\n").translate(_ENCODE) if good else b""
    tokens = (torch.frombuffer(bytearray(encoded), dtype=torch.uint8) if encoded
              else torch.empty(0, dtype=torch.uint8))
    return Corpus(tokens=tokens, sha256=hashlib.sha256(data).hexdigest(), source=source,
                  lines_total=len(lines), lines_skipped=len(skipped), skipped_examples=skipped[:20])


def _mix(seed: int, data_step: int) -> int:
    """A 63-bit generator seed from (seed, data step); hashing keeps nearby steps uncorrelated."""
    digest = hashlib.blake2b(f"{seed}:{data_step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class BatchSampler:
    """Random windows of the training split; the windows of a step depend only on (seed, data step).

    The effective batch of a step is drawn whole and cut into micro-batches, so halving the
    micro-batch after an OOM trains on exactly the same samples.
    """

    def __init__(self, tokens: torch.Tensor, block_size: int, seed: int) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.seed = seed
        self.n_windows = len(tokens) - block_size - 1 + 1
        if self.n_windows < 1:
            raise ValueError(f"split has {len(tokens)} tokens, need at least {block_size + 1}")
        self._offsets = torch.arange(block_size + 1)

    def step_starts(self, data_step: int, batch_size: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(_mix(self.seed, data_step))
        return torch.randint(0, self.n_windows, (batch_size,), generator=g)

    def micro_batch(self, starts: torch.Tensor, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of micro-batch ``index`` (of ``size`` samples) of a step's ``starts``."""
        rows = self.tokens[starts[index * size:(index + 1) * size, None] + self._offsets].long()
        return rows[:, :-1], rows[:, 1:]


def split(corpus: Corpus) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, eval) token tensors: the last EVAL_FRACTION is held out for the final eval loss."""
    n_eval = int(len(corpus.tokens) * EVAL_FRACTION)
    return corpus.tokens[: len(corpus.tokens) - n_eval], corpus.tokens[len(corpus.tokens) - n_eval:]
