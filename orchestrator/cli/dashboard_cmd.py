"""``orch dashboard``: serve the read-only web UI (``orchestrator/dashboard``) until interrupted."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import click

from orchestrator.cli.app import _ctx, main


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. On a loopback one, requests must also name a loopback host.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on (0: any free one, printed).")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Read the token every request needs from this file's first line (>= 16 characters of "
                   "A-Za-z0-9._~-) instead of generating one.")
def dashboard(host: str, port: int, token_file: Path | None) -> None:
    """A web page of every job: their states, the attempts and why each ended, a job's loss curve, goodput,
    checkpoints, events and logs. Read-only (it cannot change a job), refreshed every 15 s, served until Ctrl-C.
    Every request needs the token in the printed URL (once: a cookie keeps it), on 127.0.0.1 too.
    Needs the dashboard extra (pip install 'orch[dashboard]'). Exit 2 when it is missing, for an address that
    cannot be listened on, or a token file that cannot be read; nothing is written then."""
    from orchestrator.errors import UsageError

    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise UsageError(f"orch dashboard needs the dashboard extra ({e.name} is missing): "
                         "pip install 'orch[dashboard]'") from None
    from orchestrator.dashboard.app import make_app
    from orchestrator.dashboard.readonly import ReadOnlyDatabase
    from orchestrator.dashboard.security import is_loopback, load_token

    token = load_token(token_file)  # before anything is opened or bound
    sock = _listen(host, port)
    cfg, _db = _ctx()  # creates or upgrades the schema as every command does; the pages read through:
    app = make_app(ReadOnlyDatabase(cfg), cfg, token, loopback_only=is_loopback(host))
    shown_host = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host  # an address others can open
    shown_host = f"[{shown_host}]" if ":" in shown_host else shown_host
    url = f"http://{shown_host}:{sock.getsockname()[1]}/?token={token}"  # URL-safe: TOKEN_RE
    click.echo(f"orch dashboard: {url}  (read-only; Ctrl-C stops it)", err=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", server_header=False, date_header=False,
                                           access_log=False, proxy_headers=False))
    server.run(sockets=[sock])


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound and listening on ``host:port``; UsageError (exit 2) when it cannot be."""
    from orchestrator.errors import UsageError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise UsageError(f"--host {host!r}: not an address of this machine") from None
    family, kind, proto, _name, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        why = "in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise UsageError(f"cannot listen on {host}:{port}: {why}") from None
    return sock
