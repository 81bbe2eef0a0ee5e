"""lifecycle: launch claims, the stop sequence, typed retry plans, backoff in SQL

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Schema: ``attempts.claimed_at`` (a launcher's claim; 0001 kept it in ``submitted_at`` of a pending
attempt), ``attempts.stop_requested_at`` + ``stop_reason`` (the stop sequence; 0001 hid a hang stop
in ``backend_state = "hang-stop@<unix time>"``), ``jobs.auto_requeue`` (0001 kept it in the last
attempt's action dict; ``jobs.retry_not_before`` existed but was unused).

Data: every row is rewritten into the new shape, so the code reads one shape only:
- a pending attempt with ``submitted_at`` set was claimed: ``launching`` with ``claimed_at``;
- a running attempt with a hang stop in flight: ``stopping`` / ``hang`` with its time;
- action dicts ``{"action", "why", "auto", "plan": {"one_shot", "quarantine", "prune",
  "empty_trash"}, "retry_not_before", <details>}`` and plan dicts ``{"one_shot", ...}`` become the
  flat ``RetryPlan`` JSON (see ``orchestrator/core/retryplan.py``); a retryable_failed job's ``auto`` and backoff
  move to ``jobs.auto_requeue`` / ``jobs.retry_not_before``.
The conversion is written out here (not imported from the code) so that this revision keeps doing
what it did when later code changes.
"""
import json
from datetime import UTC, datetime

import sqlalchemy as sa

from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

_PLAN_KEYS = ("one_shot", "quarantine", "prune", "empty_trash")
_STICKY = ("lr", "skip_batches", "micro_batch_size")
_KNOWN = {"action", "why", "auto", "plan", "retry_not_before"}


def _plan_from_0001(action: dict | None, plan: dict | None) -> dict:
    """0001's action dict (or a new attempt's plan dict) -> the flat RetryPlan JSON of 0002."""
    action = dict(action or {})
    plan = dict(plan if plan is not None else action.get("plan") or {})
    one_shot = dict(plan.get("one_shot") or {})
    details = {k: v for k, v in action.items() if k not in _KNOWN}
    overrides = {k: details.pop(k) for k in _STICKY if details.get(k) is not None}
    resources = {"mem_mb": details["mem_mb"]} if details.get("mem_mb") is not None else {}
    nb = action.get("retry_not_before")
    return {
        "action": action.get("action") or "resume", "why": str(action.get("why") or ""),
        "auto": bool(action.get("auto")), "not_before": nb if isinstance(nb, str) and nb else None,
        "resume": one_shot.get("resume") if isinstance(one_shot.get("resume"), str) else None,
        "overrides": overrides, "resources": resources, "details": details,
        "quarantine": list(plan.get("quarantine") or []), "prune": list(plan.get("prune") or []),
        "empty_trash": bool(plan.get("empty_trash")),
    }


def upgrade() -> None:
    # Plain ADD COLUMN (SQLite has it): a batch "copy and move" would DROP the old jobs table, and
    # with foreign keys on, that cascades to every attempt and event (a test lost them all).
    op.add_column('attempts', sa.Column('claimed_at', sa.DateTime(), nullable=True))
    op.add_column('attempts', sa.Column('stop_requested_at', sa.DateTime(), nullable=True))
    op.add_column('attempts', sa.Column('stop_reason', sa.String(length=16), nullable=True))
    op.add_column('jobs', sa.Column('auto_requeue', sa.Boolean(), server_default=sa.false(), nullable=False))

    conn = op.get_bind()
    conn.execute(sa.text("UPDATE attempts SET state = 'launching', claimed_at = submitted_at, submitted_at = NULL "
                         "WHERE state = 'pending' AND submitted_at IS NOT NULL"))
    for aid, bstate in conn.execute(sa.text(
            "SELECT id, backend_state FROM attempts WHERE state = 'running' AND backend_state LIKE 'hang-stop@%'")):
        try:
            at = datetime.fromtimestamp(float(bstate.split("@", 1)[1]), UTC).replace(tzinfo=None)
        except (IndexError, ValueError, OverflowError):
            at = datetime.now(UTC).replace(tzinfo=None)
        conn.execute(sa.text("UPDATE attempts SET state = 'stopping', stop_reason = 'hang', stop_requested_at = :at, "
                             "backend_state = NULL WHERE id = :id"), {"at": at, "id": aid})
    rows = conn.execute(sa.text("SELECT id, action_json, plan_json FROM attempts "
                                "WHERE action_json IS NOT NULL OR plan_json IS NOT NULL")).all()
    for aid, action_json, plan_json in rows:
        action = json.loads(action_json) if action_json else None
        plan = json.loads(plan_json) if plan_json else None
        conn.execute(sa.text("UPDATE attempts SET action_json = :a, plan_json = :p WHERE id = :id"), {
            "id": aid,
            "a": json.dumps(_plan_from_0001(action, None), sort_keys=True) if action is not None else None,
            "p": json.dumps(_plan_from_0001(None, plan), sort_keys=True) if plan is not None else None})
    # A retryable_failed job's requeue decision moves from its last attempt's action to the job row.
    jobs = conn.execute(sa.text(
        "SELECT j.id, a.action_json FROM jobs j JOIN attempts a ON a.job_id = j.id "
        "WHERE j.state = 'retryable_failed' AND a.n = (SELECT MAX(n) FROM attempts WHERE job_id = j.id)")).all()
    for jid, action_json in jobs:
        plan = json.loads(action_json) if action_json else {}
        nb = plan.get("not_before")
        conn.execute(sa.text("UPDATE jobs SET auto_requeue = :auto, retry_not_before = :nb WHERE id = :id"), {
            "id": jid, "auto": bool(plan.get("auto")),
            "nb": datetime.fromisoformat(nb) if isinstance(nb, str) and nb else None})


def downgrade() -> None:
    raise NotImplementedError("0002 rewrites attempt records; restore the DB from a backup to go back to 0001")
