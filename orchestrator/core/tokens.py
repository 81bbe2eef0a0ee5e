"""Attempt tokens: unique per attempt, they travel with the job to the scheduler, so a submission whose
outcome a crash hid is found again by its token instead of being submitted twice."""

from __future__ import annotations

import secrets


def new_token() -> str:
    """A fresh attempt token (16 hex digits)."""
    return secrets.token_hex(8)
