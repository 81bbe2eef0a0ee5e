"""Indexes for the fleet views' windows: jobs by updated_at and by created_at, attempts by ended_at (issue 33)

``orch status`` shows the live jobs and those that ended lately, and ``orch report --since 7d`` the jobs created or
with an attempt active in its window. Without these indexes each scanned the whole history: at 100,000 jobs and
300,000 attempts ``orch status --json`` took 3.6 s and ``orch report --since 7d`` 0.32 s for 1,000 live jobs. With
them the cost follows the window, not the history. An ended job's ``updated_at`` is when it got there (only a move
sets it).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_jobs_updated_at', 'jobs', ['updated_at'], unique=False)
    op.create_index('ix_jobs_created_at', 'jobs', ['created_at'], unique=False)
    op.create_index('ix_attempts_ended_at', 'attempts', ['ended_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_attempts_ended_at', table_name='attempts')
    op.drop_index('ix_jobs_created_at', table_name='jobs')
    op.drop_index('ix_jobs_updated_at', table_name='jobs')
