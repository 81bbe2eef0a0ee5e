"""What runs on the compute node, beside the user's program: the job wrapper (``python -m
orchestrator.jobside.wrapper``, Slurm's batch process or the local backend's detached session) and its
``supervisor`` (the program's process, the stops delivered to it, what it left running), the per-rank parent
(``rankend``) and the command that starts the ranks (``ranklaunch``), the disk ballast, the memory cgroup, the spot
notice watch, the stopped-program watch, the MLflow run arrangement, and the /proc reader they share.

Stdlib and ``orchestrator.protocol`` only (a layer test holds it): the wrapper starts in any environment, fast, with
no SQLAlchemy, click or controller code. The controller may import from here (a command line to launch, the ballast
to give back); nothing here imports the controller.
"""
