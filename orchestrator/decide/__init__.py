"""What orch decides, as functions of evidence: why an attempt ended (``classify``), what the next attempt does
differently (``policy``, its value ``retryplan.RetryPlan``), which rank stopped making progress (``staleness``),
which nodes to keep jobs off (``suspects``), and the mean time between failures handed to each attempt (``mtbf``).

These modules read the job table and the run dirs and return a decision; the operations (``launch``, ``ending``,
the reconcile pass) carry it out and record it. They import no operation, view or CLI code (a layer test holds it).
"""
