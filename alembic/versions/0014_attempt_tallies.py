"""fleet_tallies and the attempts' settled tallies (issue 33: ``orch metrics`` at 100,000 jobs)

``orch metrics`` counted failures by class over the whole attempts table and measured the steps redone after every
preemption in history by reading two heartbeat files per preemption (and each in-place restart's and rank restart's
record): 7.3 s at 100,000 jobs with 200,000 preemptions, on every reconcile pass that exports the textfile. An
attempt's share is final once it ended: a reconcile pass now adds it to the running totals (``fleet_tallies``) in
the transaction that marks the attempt settled, and the metrics add only the attempts not settled yet.
``redone_count`` NULL: not settled (every attempt before this migration: the passes after it settle them, a bounded
batch each). ``ix_attempts_unsettled`` holds only those rows, so finding them does not grow with history.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""
import sqlalchemy as sa

from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

# Frozen here (a migration must not change when the models do): models.UNSETTLED_SQL as of this revision.
UNSETTLED = "redone_count IS NULL"


def upgrade() -> None:
    op.create_table('fleet_tallies',
                    sa.Column('name', sa.String(length=64), nullable=False),
                    sa.Column('value', sa.BigInteger(), nullable=False),
                    sa.PrimaryKeyConstraint('name', name=op.f('pk_fleet_tallies')))
    # ADD COLUMN without a default: no table rebuild on SQLite for a big history.
    op.add_column('attempts', sa.Column('redone_sum', sa.Integer(), nullable=True))
    op.add_column('attempts', sa.Column('redone_count', sa.Integer(), nullable=True))
    op.add_column('attempts', sa.Column('redone_unmeasured', sa.Integer(), nullable=True))
    op.add_column('attempts', sa.Column('restart_classes_json', sa.Text(), nullable=True))
    op.create_index('ix_attempts_unsettled', 'attempts', ['job_id'], unique=False,
                    sqlite_where=sa.text(UNSETTLED), postgresql_where=sa.text(UNSETTLED))


def downgrade() -> None:
    op.drop_index('ix_attempts_unsettled', table_name='attempts')
    op.drop_table('fleet_tallies')
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('restart_classes_json')
        batch_op.drop_column('redone_unmeasured')
        batch_op.drop_column('redone_count')
        batch_op.drop_column('redone_sum')
