"""events.attempt_id: an attempt's history (every attempt move writes an event)

NULL for the job's own moves and notes, and for every event written before this revision (attempt
moves wrote none then). A plain ADD COLUMN on SQLite (no rebuild of a long history); the index serves
``orch show --events``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""
import sqlalchemy as sa

from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # No foreign key: SQLite cannot ALTER one in without copying the whole events table, and the job's own
    # foreign key (ON DELETE CASCADE) already removes an attempt's events with its job.
    op.add_column('events', sa.Column('attempt_id', sa.Integer(), nullable=True))
    op.create_index(op.f('ix_events_attempt_id'), 'events', ['attempt_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_events_attempt_id'), table_name='events')
    with op.batch_alter_table('events') as batch_op:
        batch_op.drop_column('attempt_id')
