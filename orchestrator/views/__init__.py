"""What orch shows, read-only: ``orch status`` rows (``status``, with a path that never imports SQLAlchemy),
``orch show`` and ``orch logs`` (``show``), goodput (``goodputview``, ``goodputquick``, ``goodputrows``), the
Prometheus text (``metrics``), the loss curve and its picture (``losscurve``, ``plot``), a job followed until it
settles (``progressview``), and the range a heartbeat's numbers must lie in before any of them computes with it
(``progressbounds``).

A view reads the job table and the run dirs and changes neither; it runs no operation of its own (``orch watch``
hands ``progressview.follow`` the reconcile pass). A layer test holds it: nothing here imports ``ops`` or ``cli``.
"""
