"""Cloud spot interruption notices, watched from inside orch's job wrapper.

A spot VM is told before the cloud takes it back (AWS: 2 minutes; GCP and Azure: at least 30 s),
earlier than any scheduler's SIGTERM and often earlier than the VM's own shutdown. The wrapper runs one
``Watcher`` thread that polls the metadata endpoint of the VM it runs on and, at the first notice,
calls back so the program gets the stop it gets for a preemption's SIGTERM while there is still time
to checkpoint.

Rules, each from a way a watcher could do harm:
- only a well-formed notice stops a job: an HTML page, a 500, a timeout, an answer over
  ``BODY_LIMIT`` or anything else not understood is trouble, logged once, and polling continues (a
  captive proxy answering every URL with 200 must not stop every job);
- nothing here may end the wrapper: every error stays inside the thread, which is a daemon;
- every request has a deadline, and no proxy or redirect is followed: the metadata service is
  link-local, and ``http_proxy`` in a job's environment must not send its token elsewhere. Hence
  ``http.client`` (what ``urllib`` is built on) rather than ``urllib.request``, which honours both.

Stdlib only; ``http.client`` is imported on the first request, so the CLI and orch.toml's checks can
import the names here at no cost.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

PROVIDERS = ("aws", "gcp", "azure")
CHOICES = ("off", "auto", *PROVIDERS)  # what --spot-notice and orch.toml's [spot] notice take
DEFAULT_URL = "http://169.254.169.254"  # every one of the three answers there
DEFAULT_INTERVAL_S = 5.0  # AWS's documented polling interval
BODY_LIMIT = 64 * 1024  # a real answer is under 1 KiB


class Trouble(Exception):
    """The endpoint could not be asked, or answered something that is neither 'no notice' nor a notice."""


@dataclass(frozen=True)
class Notice:
    provider: str
    detail: str

    def __str__(self) -> str:
        return f"{self.provider}: {self.detail}"


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


def request(base_url: str, path: str, *, method: str = "GET", headers: dict[str, str] | None = None,
            timeout_s: float = 2.0) -> Answer:
    """One request to ``base_url + path``: no proxy, no redirect, at most BODY_LIMIT bytes of body,
    the body read within ``timeout_s`` in all. Raises Trouble."""
    import http.client

    u = urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise Trouble(f"not an http URL: {base_url!r}")
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    deadline = time.monotonic() + timeout_s
    conn = cls(u.hostname, u.port, timeout=timeout_s)
    try:
        conn.request(method, u.path.rstrip("/") + path, headers=headers or {})
        sock = conn.sock  # getresponse() drops conn.sock when the server closes after answering
        resp = conn.getresponse()
        body = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Trouble(f"{path}: no complete answer within {timeout_s:g} s")
            sock.settimeout(left)  # a server that trickles its body is held to the deadline
            chunk = resp.read1(16384)
            if not chunk:
                break
            body += chunk
            if len(body) > BODY_LIMIT:
                raise Trouble(f"{path}: answer over {BODY_LIMIT // 1024} KiB")
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, bytes(body))
    except TimeoutError:
        raise Trouble(f"{path}: no complete answer within {timeout_s:g} s") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise Trouble(f"{path}: {type(e).__name__}: {e}") from None
    finally:
        conn.close()


def _preview(body: bytes) -> str:
    return repr(body[:60]) + ("..." if len(body) > 60 else "")


def _json(a: Answer, what: str) -> object:
    try:
        return json.loads(a.body)
    except (ValueError, RecursionError):
        raise Trouble(f"{what}: not JSON: {_preview(a.body)}") from None


# --- what each provider's answer means (pure: unit-tested on every shape) -----------------------------
AWS_ACTIONS = ("terminate", "stop", "hibernate")


def parse_aws(a: Answer) -> Notice | None:
    """``spot/instance-action``: 404 until a notice, then 200 ``{"action": ..., "time": ...}``."""
    if a.status == 404:
        return None
    if a.status != 200:
        raise Trouble(f"spot/instance-action answered HTTP {a.status}")
    doc = _json(a, "spot/instance-action")
    if not isinstance(doc, dict) or doc.get("action") not in AWS_ACTIONS:
        raise Trouble(f"spot/instance-action: no known action in {_preview(a.body)}")
    when = doc.get("time")
    return Notice("aws", f"{doc['action']} at {when}" if isinstance(when, str) else doc["action"])


def parse_gcp(a: Answer) -> Notice | None:
    """``instance/preempted``: the text ``FALSE``, then ``TRUE``."""
    if a.status != 200:
        raise Trouble(f"instance/preempted answered HTTP {a.status}")
    text = a.body.strip()
    if text == b"TRUE":
        return Notice("gcp", "preempted")
    if text == b"FALSE":
        return None
    raise Trouble(f"instance/preempted: neither TRUE nor FALSE: {_preview(a.body)}")


def parse_azure(a: Answer, vm_name: str | None = None) -> Notice | None:
    """Scheduled Events: a ``Preempt`` event for this VM. ``vm_name``: events naming only other VMs
    (an availability set sees its neighbours' events) are not ours; unknown name: any Preempt counts."""
    if a.status != 200:
        raise Trouble(f"scheduledevents answered HTTP {a.status}")
    doc = _json(a, "scheduledevents")
    if not isinstance(doc, dict) or not isinstance(doc.get("Events"), list):
        raise Trouble(f"scheduledevents: no Events list in {_preview(a.body)}")
    for ev in doc["Events"]:
        if not isinstance(ev, dict) or ev.get("EventType") != "Preempt":
            continue
        res = ev.get("Resources")
        if vm_name and isinstance(res, list) and res and vm_name not in res:
            continue
        when = ev.get("NotBefore")
        return Notice("azure", "Preempt" + (f" not before {when}" if isinstance(when, str) and when else ""))
    return None


# --- how each provider is asked -------------------------------------------------------------------------
class Provider:
    name = "?"

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url, self.timeout_s = base_url, timeout_s

    def _ask(self, path: str, headers: dict[str, str], method: str = "GET") -> Answer:
        return request(self.base_url, path, method=method, headers=headers, timeout_s=self.timeout_s)

    def poll(self) -> Notice | None:
        """The notice if there is one. Raises Trouble."""
        raise NotImplementedError

    def probe(self) -> bool:
        """Does ``base_url`` answer as this provider's metadata service? (auto-detection)"""
        raise NotImplementedError


_AWS_TOKEN_RE = re.compile(rb"[A-Za-z0-9+/=_-]{8,400}")


class Aws(Provider):
    """IMDSv2: a session token (PUT), then the token on every GET."""

    name = "aws"
    PATH = "/latest/meta-data/spot/instance-action"
    TOKEN_TTL_S = 21600

    def __init__(self, base_url: str, timeout_s: float) -> None:
        super().__init__(base_url, timeout_s)
        self._token: str | None = None
        self._token_until = 0.0

    def token(self) -> str:
        if self._token is None or time.monotonic() > self._token_until:
            a = self._ask("/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)},
                          method="PUT")
            if a.status != 200 or not _AWS_TOKEN_RE.fullmatch(a.body.strip()):
                raise Trouble(f"IMDSv2 token request answered HTTP {a.status}: {_preview(a.body)}")
            self._token, self._token_until = a.body.strip().decode(), time.monotonic() + self.TOKEN_TTL_S - 60
        return self._token

    def poll(self) -> Notice | None:
        a = self._ask(self.PATH, {"X-aws-ec2-metadata-token": self.token()})
        if a.status == 401:
            self._token = None  # expired or revoked: the next poll asks for a new one
        return parse_aws(a)

    def probe(self) -> bool:
        try:
            self.token()
        except Trouble:
            return False
        return True


class Gcp(Provider):
    name = "gcp"
    PATH = "/computeMetadata/v1/instance/preempted"
    HEADERS = {"Metadata-Flavor": "Google"}

    def poll(self) -> Notice | None:
        return parse_gcp(self._ask(self.PATH, self.HEADERS))

    def probe(self) -> bool:
        try:
            a = self._ask(self.PATH, self.HEADERS)
        except Trouble:
            return False
        return a.status == 200 and a.headers.get("metadata-flavor") == "Google"


class Azure(Provider):
    name = "azure"
    HEADERS = {"Metadata": "true"}
    PATH = "/metadata/scheduledevents?api-version=2020-07-01"
    VM_NAME = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"

    def __init__(self, base_url: str, timeout_s: float) -> None:
        super().__init__(base_url, timeout_s)
        self.vm_name: str | None = None

    def _learn_name(self) -> bool:
        try:
            a = self._ask(self.VM_NAME, self.HEADERS)
        except Trouble:
            return False
        name = a.body.strip().decode("ascii", "replace")
        if a.status == 200 and 0 < len(name) <= 64 and re.fullmatch(r"[A-Za-z0-9._-]+", name):
            self.vm_name = name
        return self.vm_name is not None

    def poll(self) -> Notice | None:
        if self.vm_name is None:
            self._learn_name()
        return parse_azure(self._ask(self.PATH, self.HEADERS), self.vm_name)

    def probe(self) -> bool:
        # The instance endpoint, not scheduledevents: Azure's first scheduledevents call can take
        # minutes while it enables the service, longer than a probe may wait.
        return self._learn_name()


_CLASSES: dict[str, type[Provider]] = {"aws": Aws, "gcp": Gcp, "azure": Azure}


def provider(name: str, base_url: str = DEFAULT_URL, timeout_s: float = 2.0) -> Provider:
    return _CLASSES[name](base_url, timeout_s)


def detect(base_url: str = DEFAULT_URL, timeout_s: float = 0.5) -> Provider | None:
    """The provider whose metadata service answers at ``base_url``, or None (not a cloud VM).

    At most one short request per provider: on a machine with no metadata service each fails at
    once (no route) or within ``timeout_s``.
    """
    for cls in _CLASSES.values():
        p = cls(base_url, timeout_s)
        if p.probe():
            return p
    return None


def _stderr(msg: str) -> None:
    print(f"orch wrapper: spot notices: {msg}", file=sys.stderr, flush=True)


class Watcher:
    """Polls one provider every ``interval_s`` from a daemon thread; at the first notice calls
    ``on_notice`` once and ends. ``stop()`` ends it without a call (the program ended first)."""

    def __init__(self, which: str, on_notice: Callable[[Notice], None], *, base_url: str = DEFAULT_URL,
                 interval_s: float = DEFAULT_INTERVAL_S, log: Callable[[str], None] = _stderr) -> None:
        if which not in ("auto", *PROVIDERS):
            raise ValueError(f"unknown spot notice provider {which!r}")
        self.which, self.on_notice, self.base_url, self.log = which, on_notice, base_url, log
        self.interval_s = interval_s
        self.timeout_s = min(2.0, max(0.5, interval_s))  # a poll never takes much longer than the interval
        self.polls = 0
        self.troubles = 0
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="orch-spot-notice", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        try:
            if self.which == "auto":
                p = detect(self.base_url, min(self.timeout_s, 1.0))
                if p is None:
                    self.log(f"no cloud metadata service answers at {self.base_url}; not watching")
                    return
                p.timeout_s = self.timeout_s
                self.log(f"detected {p.name} at {self.base_url}")
            else:
                p = provider(self.which, self.base_url, self.timeout_s)
            self.log(f"watching {p.name} at {self.base_url} every {self.interval_s:g} s")
            while not self._stopped.is_set():
                notice = self._poll(p)
                if notice is not None:
                    if not self._stopped.is_set():
                        self.log(f"notice ({notice}): stopping the program as for a preemption")
                        self.on_notice(notice)
                    return
                self._stopped.wait(self.interval_s)
        except Exception as e:  # a bug here must cost the notice, never the wrapper
            self.log(f"watcher ended by an internal error: {type(e).__name__}: {e}")

    def _poll(self, p: Provider) -> Notice | None:
        self.polls += 1
        try:
            return p.poll()
        except Trouble as e:
            self.troubles += 1
            if self.troubles == 1:  # once: a metadata service that is down says so every few seconds
                self.log(f"{e} (polling continues; later errors are not logged)")
            return None
