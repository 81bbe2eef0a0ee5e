"""What orch does on the controller: every operation that changes the job table or a run dir. ``submit`` and
``sweep`` (with their quick paths on stdlib sqlite3, ``quicksubmit``, ``quicksweep``, and ``sweepspec``), ``launch``
(``launchclaim``: the fenced claim; ``launchprep``: the run dir; ``launchrecord``: the id, or why it ended;
``claimkeeper``), the reconcile pass (``reconcile``: ``attemptpoll`` turns what the backends say
into lifecycle moves, ``attemptend`` is the one place an attempt ends), ``requeue``, ``cancel``, the trash,
``liveness`` (which processes still run in a run dir, whatever the DB says), and ``executor`` (submitit's API).

An operation carries out what ``decide`` returns and records it through ``lifecycle``; ``views`` and ``decide``
import nothing from here (a layer test holds it).
"""
