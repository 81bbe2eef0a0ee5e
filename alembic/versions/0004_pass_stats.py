"""pass_stats: the last reconciler pass's duration and scheduler query failures (orch metrics)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""
import sqlalchemy as sa

from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('pass_stats',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('finished_at', sa.DateTime(), nullable=False),
    sa.Column('duration_s', sa.Float(), nullable=False),
    sa.Column('polled', sa.Integer(), nullable=False),
    sa.Column('errors', sa.Integer(), nullable=False),
    sa.Column('query_failures', sa.Integer(), nullable=False),
    sa.Column('passes_total', sa.Integer(), nullable=False),
    sa.Column('query_failures_total', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_pass_stats'))
    )


def downgrade() -> None:
    op.drop_table('pass_stats')
