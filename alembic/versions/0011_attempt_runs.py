"""attempts.runs_json: the scheduler's account of each run of an attempt (issue 45, goodput counts every held second)

A Slurm job requeued in place runs one orch attempt several times. Goodput took an attempt's hold from when
reconcile passes saw it start and end: a run that no pass saw was counted as queue waiting, and the queue time
between two runs as held. ``runs_json`` keeps sacct's per-run Start and End ([[start, end], ...], epoch seconds,
end null while the run runs), written by observe whenever it changes. NULL: no account (the local backend, or an
attempt that ended before this migration): the hold is what the passes saw, as before.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""
import sqlalchemy as sa

from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain nullable ADD COLUMN: no table rebuild on SQLite for a big history.
    op.add_column('attempts', sa.Column('runs_json', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('runs_json')
