"""The Slurm backend: ``sbatch`` (validated submissions), ``states`` (sacct/squeue -> phases and
causes, pure functions), ``backend`` (the ``Backend`` that runs the commands)."""

from orchestrator.backends.slurm.backend import SlurmBackend
from orchestrator.backends.slurm.output import over_memory_line, slurm_output_path
from orchestrator.backends.slurm.sbatch import (
    JOB_NAME_PREFIX,
    SlurmSubmitRefused,
    batch_script,
    clean_submit_env,
    job_name_for,
    validate_extra_sbatch,
    warning_lead_s,
)

__all__ = ["SlurmBackend", "SlurmSubmitRefused", "JOB_NAME_PREFIX", "batch_script", "clean_submit_env",
           "job_name_for", "over_memory_line", "slurm_output_path", "validate_extra_sbatch", "warning_lead_s"]
