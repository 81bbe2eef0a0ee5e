"""A cloud metadata service on 127.0.0.1 for the spot notice tests (a real HTTP server in a thread).

One provider's endpoints, as the clouds document them (the headers each requires included): "no
notice" until the test calls ``set("notice")``, or a chosen kind of garbage on the notice endpoint
(``html``, ``500``, ``hang``, ``huge``, ``trickle``). Every request is recorded, so a test can wait
for polls and can prove that nothing polled at all.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

AWS_TOKEN = "AQAEAFakeImdsV2Token0123456789abcdef=="
AZURE_VM = "vm-spot-1"
NOTICE_PATHS = {"aws": "/latest/meta-data/spot/instance-action", "gcp": "/computeMetadata/v1/instance/preempted",
                "azure": "/metadata/scheduledevents?api-version=2020-07-01"}
MODES = ("quiet", "notice", "html", "500", "hang", "huge", "trickle")


@dataclass(frozen=True)
class Seen:
    at: float
    method: str
    path: str
    headers: dict[str, str]
    mode: str  # what the notice endpoint was answering then


def notice_body(provider: str, pad: int = 0) -> bytes:
    """The provider's notice; ``pad`` bytes more of it keep it well formed (the ``huge`` answer)."""
    if provider == "aws":
        return json.dumps({"action": "terminate", "time": "2026-12-01T05:00:00Z", "pad": "x" * pad}).encode()
    if provider == "gcp":
        return b"TRUE" + b" " * pad
    return json.dumps({"DocumentIncarnation": 2, "Events": [{
        "EventId": "A1B2", "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": [AZURE_VM],
        "EventStatus": "Scheduled", "NotBefore": "Tue, 01 Dec 2026 05:00:00 GMT", "Description": "x" * pad,
        "EventSource": "Platform", "DurationInSeconds": -1}]}).encode()


class FakeMetadata:
    """``with FakeMetadata("aws") as md: ... md.url ... md.set("notice")``."""

    def __init__(self, provider: str) -> None:
        assert provider in NOTICE_PATHS
        self.provider = provider
        self.mode = "quiet"
        self.requests: list[Seen] = []
        self.first_notice_at: float | None = None  # when a notice was first served
        self.trickles_completed = 0  # trickled answers sent to the end (a client that waits for them all)
        self._closing = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a: object) -> None:
                pass

            def do_GET(self) -> None:  # http.server's naming
                fake._answer(self)

            def do_PUT(self) -> None:
                fake._answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> FakeMetadata:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._closing.set()  # ends hanging and trickling answers
        self.server.shutdown()
        self.server.server_close()

    def set(self, mode: str) -> float:
        """Switch what the notice endpoint answers; returns the time of the switch."""
        assert mode in MODES
        self.mode = mode
        return time.time()

    def polls(self, mode: str | None = None) -> list[Seen]:
        """Requests to the notice endpoint (while it answered ``mode``)."""
        return [s for s in self.requests if s.path == NOTICE_PATHS[self.provider] and mode in (None, s.mode)]

    # --- the endpoints ---------------------------------------------------------------------------
    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        mode = self.mode
        self.requests.append(Seen(time.time(), h.command, h.path, {k.lower(): v for k, v in h.headers.items()}, mode))
        hdr = {k.lower(): v for k, v in h.headers.items()}
        p, key = self.provider, (h.command, h.path)
        if p == "aws" and key == ("PUT", "/latest/api/token"):
            if "x-aws-ec2-metadata-token-ttl-seconds" not in hdr:
                return self._send(h, 400, b"missing token TTL")
            return self._send(h, 200, AWS_TOKEN.encode())
        if p == "azure" and h.command == "GET" and h.path.startswith("/metadata/instance/compute/name?"):
            if hdr.get("metadata") != "true":
                return self._send(h, 400, b"Bad request: Metadata header missing")
            return self._send(h, 200, AZURE_VM.encode())
        if key != ("GET", NOTICE_PATHS[p]):
            return self._send(h, 404, b"not found")
        if p == "aws" and hdr.get("x-aws-ec2-metadata-token") != AWS_TOKEN:
            return self._send(h, 401, b"")
        if p == "gcp" and hdr.get("metadata-flavor") != "Google":
            return self._send(h, 403, b"Missing Metadata-Flavor:Google header.")
        if p == "azure" and hdr.get("metadata") != "true":
            return self._send(h, 400, b"Bad request")
        self._notice_endpoint(h, mode)

    def _notice_endpoint(self, h: BaseHTTPRequestHandler, mode: str) -> None:
        p = self.provider
        if mode == "quiet":
            if p == "aws":
                return self._send(h, 404, b"<?xml version=\"1.0\"?><html>404 - Not Found</html>")
            return self._send(h, 200, b"FALSE" if p == "gcp" else b'{"DocumentIncarnation": 1, "Events": []}')
        if mode == "notice":
            if self.first_notice_at is None:
                self.first_notice_at = time.time()
            return self._send(h, 200, notice_body(p))
        if mode == "html":  # a captive portal or a proxy's error page, with every word a notice has
            return self._send(h, 200, b"<html><body>TRUE terminate Preempt</body></html>", "text/html")
        if mode == "500":
            return self._send(h, 500, b"Internal Server Error")
        if mode == "hang":  # accepts, never answers
            self._closing.wait(60)
            return None
        if mode == "huge":
            return self._send(h, 200, notice_body(p, pad=4 << 20))
        body = notice_body(p)  # trickle: a notice, one byte every 0.2 s
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        try:
            for i in range(len(body)):
                if self._closing.wait(0.2):
                    return None
                h.wfile.write(body[i:i + 1])
                h.wfile.flush()
            self.trickles_completed += 1  # the whole answer went out: the client waited for all of it
        except OSError:
            pass
        return None

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "text/plain") -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(body)))
            if self.provider == "gcp":
                h.send_header("Metadata-Flavor", "Google")
            h.end_headers()
            h.wfile.write(body)
        except OSError:  # the watcher gave up on a huge answer and hung up
            pass
