"""Who may read the dashboard, and the headers every answer carries.

* Every request needs the token (``?token=`` once, which sets an HttpOnly cookie and redirects to the same page
  without it; or ``Authorization: Bearer``), compared in constant time; without it: 401 and nothing else. Also on
  127.0.0.1: a login node has many users, and every one of them can connect to its loopback (review of the first
  version, which needed no token there).
* Bound to a loopback address (the default, 127.0.0.1), the Host header must name a loopback host too, so a web
  page in the user's browser cannot reach it through a rebound DNS name.
* The token is never written into a page. Its cookie is named by the port (``orch_dashboard_<port>``): two
  dashboards on one host no longer overwrite each other's; a cookie is still sent to every port of the host name.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from orchestrator.errors import UsageError

COOKIE = "orch_dashboard_"  # + the port
HEADERS = {
    # nothing from another origin; the one stylesheet and script are served by the dashboard itself
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
MIN_TOKEN_CHARS = 16
TOKEN_RE = re.compile(r"[A-Za-z0-9._~-]+")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine only."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_token(token_file: Path | None) -> str:
    """The token requests must carry: read from ``token_file`` (its first line) or generated. UsageError for a file
    that cannot be read, or a token that is short or not URL-safe (it travels in the printed URL and a cookie)."""
    if token_file is None:
        return secrets.token_urlsafe(32)
    try:
        token = token_file.read_text(encoding="utf-8", errors="strict").splitlines()[0].strip()
    except (OSError, UnicodeError, IndexError) as e:
        raise UsageError(f"--token-file {token_file}: cannot read a token from it ({type(e).__name__})") from None
    if len(token) < MIN_TOKEN_CHARS or not TOKEN_RE.fullmatch(token):
        raise UsageError(f"--token-file {token_file}: the token must be at least {MIN_TOKEN_CHARS} characters of "
                         "A-Z, a-z, 0-9, '.', '_', '~' or '-'")
    return token


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())


def _host_name(request: Request) -> str:
    """The Host header's name, without its port (an IPv6 address keeps its brackets)."""
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _cookie(scope: dict) -> str:
    server = scope.get("server") or ("", 0)
    return f"{COOKIE}{server[1] or 0}"


class Guard:
    """ASGI middleware: the access rule above, then the security headers on every answer."""

    def __init__(self, app: Callable, token: str | None, loopback_only: bool) -> None:
        self.app, self.token, self.loopback_only = app, token, loopback_only

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "websocket":  # no route takes one; refused before the app, as every request would be
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is not None:
            await _with_headers(refusal)(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> Awaitable[None] | None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k.lower().encode(), v.encode()) for k, v in HEADERS.items() if k.lower().encode() not in have]
            return await send(message)

        await self.app(scope, receive, send_with_headers)

    def _refusal(self, request: Request) -> Response | None:
        if self.loopback_only and not is_loopback(_host_name(request)):
            return PlainTextResponse("refused: this dashboard answers to localhost only\n", status_code=403)
        if self.token is None:
            return None
        cookie = _cookie(request.scope)
        given = request.query_params.get("token")
        if given is not None:
            if not _same(given, self.token):
                return PlainTextResponse("refused: wrong token\n", status_code=401)
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            # the path as it was sent (a %3F stays one), and never "//host": a redirect stays on this server
            path = "/" + request.scope.get("raw_path", b"/").decode("latin-1").lstrip("/")
            to = RedirectResponse(path + (f"?{rest}" if rest else ""), status_code=303)
            to.set_cookie(cookie, self.token, httponly=True, samesite="strict", path="/")
            return to
        auth = request.headers.get("authorization", "")
        bearer = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if _same(request.cookies.get(cookie), self.token) or _same(bearer, self.token):
            return None
        return PlainTextResponse("refused: this dashboard needs its token (the URL orch dashboard printed)\n",
                                 status_code=401)


def _with_headers(response: Response) -> Response:
    for k, v in HEADERS.items():
        response.headers[k] = v
    return response
