"""``python -m trainer``: an alias of ``python -m orch_trainer``, the bundled trainer, kept for scripts
written before the rename.

The bundled trainer's package is ``orch_trainer`` (a name users' projects do not have: a user's
own ``trainer.py`` shadowed this package and broke orch's integrations). Nothing in orch imports this
alias, and the in-job kit lives in ``orchestrator.kit``: a user module named ``trainer`` only hides the
alias, never anything orch needs.
"""
