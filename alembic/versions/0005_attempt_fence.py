"""attempts.fence: the fencing generation of an attempt's launch claim (and launched_fence)

Every claim (pending -> launching) and every re-claim of an expired one increments it in the same
compare-and-set UPDATE; the launcher re-checks it right before the backend call and the job wrapper
checks it (attempts/<n>/fence.json) before it runs the program, so a launcher that lost its claim
never runs a second copy of the attempt.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""
import sqlalchemy as sa

from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN (NOT NULL with a default) on SQLite too: no table rebuild for a big history.
    op.add_column('attempts', sa.Column('fence', sa.Integer(), server_default='0', nullable=False))
    op.add_column('attempts', sa.Column('launched_fence', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('launched_fence')
        batch_op.drop_column('fence')
