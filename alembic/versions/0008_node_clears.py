"""node_clears: `orch nodes --clear NAME` ends a suspect node's exclusion (issue 20)

The evidence against a node is the job table itself (attempts.nodes, failure_class, ended_at); only the
clears are stored: a failure that ended before a node's latest clear no longer counts against it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""
import sqlalchemy as sa

from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('node_clears',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('backend', sa.String(length=16), nullable=False),
    sa.Column('cleared_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_node_clears'))
    )
    op.create_index(op.f('ix_node_clears_node'), 'node_clears', ['node'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_node_clears_node'), table_name='node_clears')
    op.drop_table('node_clears')
