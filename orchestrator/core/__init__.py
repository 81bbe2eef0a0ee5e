"""The controller's core: the job table (``models``, ``db``, ``quickdb`` on stdlib sqlite3 for the quick paths,
``jobqueries``), the states and the one place they move (``states``, ``lifecycle``), the values stored with them
(``retryplan``, ``resources``, ``environments``, ``tokens``), what a reconcile pass changed (``passchanges``),
``$ORCH_HOME`` and ``orch.toml`` (``config``, ``settings``, ``rundir``), and the accounting of held time
(``goodput``), what a framework resumes from (``resumestate``), a job's tracker run ended (``trackerend``).

Every other controller package builds on it; it imports none of them (a layer test holds it).
"""
