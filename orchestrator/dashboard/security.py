"""Who may read the dashboard, and the headers every answer carries.

* Bound to a loopback address (the default, 127.0.0.1): only this machine can connect, and the Host header must
  name a loopback host too, so a web page in the user's browser cannot reach it through a rebound DNS name.
* Bound to any other address: every request needs the token (``?token=`` once, which sets an HttpOnly cookie and
  redirects to the same page without it; or ``Authorization: Bearer``), compared in constant time. A request
  without it gets 401 and nothing else; the token is never written into a page.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from orchestrator.errors import UsageError

COOKIE = "orch_dashboard_token"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")
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


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine only."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_token(host: str, token_file: Path | None) -> str | None:
    """The token requests must carry: None on a loopback address without ``--token-file``; read from the file
    (its first line) or generated otherwise. UsageError for a file that cannot be read or holds a short token."""
    if token_file is None:
        return None if is_loopback(host) else secrets.token_urlsafe(32)
    try:
        token = token_file.read_text(encoding="utf-8", errors="strict").splitlines()[0].strip()
    except (OSError, UnicodeError, IndexError) as e:
        raise UsageError(f"--token-file {token_file}: cannot read a token from it ({type(e).__name__})") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise UsageError(f"--token-file {token_file}: the token must be at least {MIN_TOKEN_CHARS} characters")
    return token


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())


def _host_name(request: Request) -> str:
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """ASGI middleware: the access rule above, then the security headers on every answer."""

    def __init__(self, app: Callable, token: str | None, loopback_only: bool) -> None:
        self.app, self.token, self.loopback_only = app, token, loopback_only

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
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
        if self.loopback_only and _host_name(request) not in LOOPBACK_HOSTS:
            return PlainTextResponse("refused: this dashboard answers to localhost only\n", status_code=403)
        if self.token is None:
            return None
        given = request.query_params.get("token")
        if given is not None:
            if not _same(given, self.token):
                return PlainTextResponse("refused: wrong token\n", status_code=401)
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            to = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
            to.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
            return to
        auth = request.headers.get("authorization", "")
        bearer = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if _same(request.cookies.get(COOKIE), self.token) or _same(bearer, self.token):
            return None
        return PlainTextResponse("refused: this dashboard needs its token (the URL orch dashboard printed)\n",
                                 status_code=401)


def _with_headers(response: Response) -> Response:
    for k, v in HEADERS.items():
        response.headers[k] = v
    return response
