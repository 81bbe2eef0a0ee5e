"""attempts.stale_rank, stale_step, stale_age_s: the hang stop's record, typed (issue 19, one rank hung)

observe stops an attempt whose oldest rank made no heartbeat progress for hang_timeout_s; which rank, at which
step and for how long were written into the free-text ``detail`` ("rank 1: no progress for 95 s at step 40;
stopping it") and classify cut the suffix off to build the final record. Now they are columns: ``stale_rank``
(NULL for a one-process job), ``stale_step`` (NULL: no step in its heartbeat, or none written), ``stale_age_s``.
Attempts stopped before this migration keep their detail and read as "no heartbeat".

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""
import sqlalchemy as sa

from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain nullable ADD COLUMNs: no table rebuild on SQLite for a big history.
    op.add_column('attempts', sa.Column('stale_rank', sa.Integer(), nullable=True))
    op.add_column('attempts', sa.Column('stale_step', sa.Integer(), nullable=True))
    op.add_column('attempts', sa.Column('stale_age_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('stale_age_s')
        batch_op.drop_column('stale_step')
        batch_op.drop_column('stale_rank')
