"""attempts.rank_restarts: how many times the attempt's ranks were restarted inside its allocation (issue 31)

``--rank-restarts`` relaunches a multi-rank program's ranks in the same attempt; the wrapper records each restart in
the run dir (``rank_restarts.json``). ``orch show`` reads that file for the one job it shows, but ``orch metrics``
counts across every attempt, and reading every attempt's run dir grows with history. Observe stores the count it
read, so the metrics open the records of the attempts that restarted only. 0: none seen (every attempt before this
migration).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""
import sqlalchemy as sa

from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ADD COLUMN with a constant default: no table rebuild on SQLite for a big history.
    op.add_column('attempts', sa.Column('rank_restarts', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('rank_restarts')
