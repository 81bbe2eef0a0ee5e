"""sweeps: a sweep row groups its task jobs; attempts launched as one array carry the batch token;
jobs remember the environment they were submitted from

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""
import sqlalchemy as sa

from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('environments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('vars_json', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_environments')),
    sa.UniqueConstraint('sha256', name=op.f('uq_environments_sha256'))
    )
    op.create_table('sweeps',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('backend', sa.String(length=16), nullable=False),
    sa.Column('throttle', sa.Integer(), nullable=True),
    sa.Column('params_json', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sweeps')),
    sa.UniqueConstraint('name', name=op.f('uq_sweeps_name'))
    )
    # SQLite adds a foreign key only by rebuilding the table (batch mode): orch runs upgrades with
    # foreign keys off, so dropping the old jobs table cannot cascade to attempts and events.
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('sweep_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('task_index', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_sweep_id'), ['sweep_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_jobs_sweep_id_sweeps'), 'sweeps', ['sweep_id'], ['id'])
        batch_op.add_column(sa.Column('env_id', sa.Integer(), nullable=True))
        batch_op.create_foreign_key(batch_op.f('fk_jobs_env_id_environments'), 'environments', ['env_id'], ['id'])
    op.add_column('attempts', sa.Column('batch_token', sa.String(length=64), nullable=True))
    op.create_index(op.f('ix_attempts_batch_token'), 'attempts', ['batch_token'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_attempts_batch_token'), table_name='attempts')
    op.drop_column('attempts', 'batch_token')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_jobs_env_id_environments'), type_='foreignkey')
        batch_op.drop_column('env_id')
        batch_op.drop_constraint(batch_op.f('fk_jobs_sweep_id_sweeps'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_jobs_sweep_id'))
        batch_op.drop_column('task_index')
        batch_op.drop_column('sweep_id')
    op.drop_table('sweeps')
    op.drop_table('environments')
