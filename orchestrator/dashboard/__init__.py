"""``orch dashboard``: a read-only web UI over the job table and the run dirs (issue 33).

Server-rendered pages (Starlette, Jinja2 with autoescape), served by uvicorn; installed with the ``dashboard``
extra, imported only by ``orch dashboard``, so login nodes without it are unaffected. It reads through a read-only
database connection (``readonly``) and has no write endpoint: every route is a GET. It binds to 127.0.0.1; another
address needs a token (``security``).
"""
