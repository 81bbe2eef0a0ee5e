"""attempts.world_size, attempts.nodes: where each attempt ran (issue 19, multi-rank jobs)

``world_size``: the ranks orch launched (``--nproc-per-node`` x ``--nodes``), NULL for a program started as
given (its own torchrun, if any, is its business); ``nodes``: the node list (Slurm's SLURM_JOB_NODELIST, e.g.
``gpu[01-02]``; locally the hostname), both from the job wrapper's exit record when the attempt ends.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""
import sqlalchemy as sa

from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain nullable ADD COLUMNs: no table rebuild on SQLite for a big history.
    op.add_column('attempts', sa.Column('world_size', sa.Integer(), nullable=True))
    op.add_column('attempts', sa.Column('nodes', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('nodes')
        batch_op.drop_column('world_size')
