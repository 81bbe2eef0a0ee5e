"""Spot notices: each provider's answer read right, every garbage answer refused, detection cheap, the
watcher thread unkillable by the network; real HTTP against tests/fakemeta.py's server on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest
from fakemeta import AWS_TOKEN, AZURE_VM, FakeMetadata, notice_body
from orchkit import wait_for

from orchestrator.jobside import spotnotice as sn
from orchestrator.jobside.spotnotice import Answer, Notice, Trouble


def ans(status: int, body: bytes | str) -> Answer:
    return Answer(status, {}, body.encode() if isinstance(body, str) else body)


# --- parsers ------------------------------------------------------------------------------------------
def test_aws_instance_action_is_a_notice_only_as_documented_json():
    assert sn.parse_aws(ans(404, "<html>404 - Not Found</html>")) is None
    assert sn.parse_aws(ans(200, '{"action": "terminate", "time": "2026-12-01T05:00:00Z"}')) == \
        Notice("aws", "terminate at 2026-12-01T05:00:00Z")
    assert sn.parse_aws(ans(200, '{"action": "stop"}')) == Notice("aws", "stop")
    assert sn.parse_aws(ans(200, '{"action": "hibernate", "time": 7}')) == Notice("aws", "hibernate")
    for bad in ('{"action": "reboot"}', "[]", '"terminate"', "<html>terminate</html>", "", '{"time": "x"}',
                "[" * 100000):
        with pytest.raises(Trouble):
            sn.parse_aws(ans(200, bad))
    for status in (401, 403, 500, 503):
        with pytest.raises(Trouble, match=f"HTTP {status}"):
            sn.parse_aws(ans(status, '{"action": "terminate"}'))


def test_gcp_preempted_is_exactly_true_or_false():
    assert sn.parse_gcp(ans(200, "TRUE")) == Notice("gcp", "preempted")
    assert sn.parse_gcp(ans(200, "TRUE\n")) == Notice("gcp", "preempted")
    assert sn.parse_gcp(ans(200, "FALSE")) is None
    for bad in ("true", "yes", "1", "<html>TRUE</html>", "", "TRUE FALSE"):
        with pytest.raises(Trouble, match="neither TRUE nor FALSE"):
            sn.parse_gcp(ans(200, bad))
    with pytest.raises(Trouble, match="HTTP 500"):
        sn.parse_gcp(ans(500, "TRUE"))


def _events(*events: dict) -> str:
    return json.dumps({"DocumentIncarnation": 3, "Events": list(events)})


def test_azure_preempt_event_for_this_vm_is_a_notice_and_other_events_are_not():
    pre = {"EventType": "Preempt", "Resources": ["vm-a"], "NotBefore": "Tue, 01 Dec 2026 05:00:00 GMT"}
    assert sn.parse_azure(ans(200, _events())) is None
    assert sn.parse_azure(ans(200, _events({"EventType": "Reboot", "Resources": ["vm-a"]}))) is None
    assert sn.parse_azure(ans(200, _events({"EventType": "Freeze"}, pre)), "vm-a") == \
        Notice("azure", "Preempt not before Tue, 01 Dec 2026 05:00:00 GMT")
    assert sn.parse_azure(ans(200, _events(pre)), "vm-b") is None  # a neighbour's eviction is not ours
    assert sn.parse_azure(ans(200, _events(pre))) is not None  # own name unknown: any Preempt counts
    assert sn.parse_azure(ans(200, _events({"EventType": "Preempt"})), "vm-a") == Notice("azure", "Preempt")
    assert sn.parse_azure(ans(200, _events("Preempt", 3, None))) is None
    for bad in ('{"Events": "Preempt"}', "[]", "<html>Preempt</html>", '{"DocumentIncarnation": 1}'):
        with pytest.raises(Trouble):
            sn.parse_azure(ans(200, bad))
    with pytest.raises(Trouble, match="HTTP 400"):
        sn.parse_azure(ans(400, _events(pre)))


# --- requests and providers against a real server -----------------------------------------------------
@pytest.mark.parametrize("provider", sn.PROVIDERS)
def test_each_provider_asks_as_documented_and_reads_quiet_then_notice(provider):
    with FakeMetadata(provider) as md:
        p = sn.provider(provider, md.url, timeout_s=2)
        assert p.poll() is None and p.poll() is None
        md.set("notice")
        n = p.poll()
        assert n is not None and n.provider == provider
        # the fake refuses a request without the provider's header, so a notice proves it was sent
        assert all(s.mode in ("quiet", "notice") for s in md.requests)
    if provider == "aws":  # one token for all three polls, sent with each
        assert [s.method for s in md.requests] == ["PUT", "GET", "GET", "GET"]
        assert {s.headers["x-aws-ec2-metadata-token"] for s in md.polls()} == {AWS_TOKEN}
    if provider == "azure":
        assert p.vm_name == AZURE_VM


def test_an_expired_aws_token_is_asked_for_again():
    with FakeMetadata("aws") as md:
        p = sn.provider("aws", md.url)
        p.token()
        p._token = "stale-token-0000"  # what the service no longer accepts
        with pytest.raises(Trouble, match="HTTP 401"):
            p.poll()
        assert p.poll() is None
        assert [s.method for s in md.requests] == ["PUT", "GET", "PUT", "GET"]


@pytest.mark.parametrize("mode,message", [("huge", "answer over 64 KiB"),
                                          ("trickle", "no complete answer within 0.6 s"),
                                          ("hang", "no complete answer within 0.6 s")])
def test_a_huge_slow_or_silent_answer_is_trouble_within_the_deadline(mode, message):
    # No wall-clock assert: the client must give up while the server is still answering. A
    # trickled answer takes the fake server seconds to send in full (one byte every 0.2 s), so a client that
    # kept reading byte by byte past its 0.6 s would have let it complete.
    with FakeMetadata("gcp") as md:
        md.set(mode)
        with pytest.raises(Trouble, match=message):
            sn.request(md.url, sn.Gcp.PATH, headers=sn.Gcp.HEADERS, timeout_s=0.6)
        assert md.trickles_completed == 0


def test_nothing_listening_is_trouble_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: connection refused
        with pytest.raises(Trouble, match="ConnectionRefused"):
            sn.request(url, "/latest/api/token", method="PUT")
        assert sn.detect(url) is None


def test_a_proxy_in_the_environment_is_never_used(monkeypatch):
    # The metadata service is link-local; its token must not go through a proxy.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    with FakeMetadata("gcp") as md:
        assert sn.provider("gcp", md.url).poll() is None


@pytest.mark.parametrize("provider", sn.PROVIDERS)
def test_detect_names_the_provider_that_answers(provider):
    with FakeMetadata(provider) as md:
        # A generous timeout: the claim is which provider is named, not how fast (0.5 s failed on a loaded machine)
        p = sn.detect(md.url, timeout_s=30)
        assert p is not None and p.name == provider
        assert md.polls("notice") == []  # detection asks; it never reads a notice as a probe


# --- the watcher thread -------------------------------------------------------------------------------
class Calls:
    def __init__(self) -> None:
        self.notices: list[Notice] = []
        self.lines: list[str] = []

    def notice(self, n: Notice) -> None:
        self.notices.append(n)

    def log(self, line: str) -> None:
        self.lines.append(line)


def test_watcher_survives_every_kind_of_garbage_logs_once_and_still_delivers_the_notice():
    calls = Calls()
    with FakeMetadata("aws") as md:
        w = sn.Watcher("aws", calls.notice, base_url=md.url, interval_s=0.05, log=calls.log)
        w.start()
        for mode in ("quiet", "html", "500", "huge", "hang", "trickle", "quiet"):
            md.set(mode)
            n = len(md.polls(mode))
            wait_for(lambda n=n, mode=mode: len(md.polls(mode)) >= n + 2, what=f"two polls while {mode}")
            assert calls.notices == [] and w.thread.is_alive()
        assert w.troubles >= 10
        assert len([line for line in calls.lines if "polling continues" in line]) == 1, calls.lines
        md.set("notice")
        wait_for(lambda: calls.notices, what="the notice")
        w.thread.join(5)
    assert calls.notices == [Notice("aws", "terminate at 2026-12-01T05:00:00Z")]
    assert not w.thread.is_alive()  # one notice, then the watcher is done


def test_a_stopped_watcher_delivers_nothing_and_polls_no_more():
    calls = Calls()
    with FakeMetadata("gcp") as md:
        w = sn.Watcher("gcp", calls.notice, base_url=md.url, interval_s=0.05, log=calls.log)
        w.start()
        wait_for(lambda: len(md.polls()) >= 2)
        w.stop()
        w.thread.join(5)
        n = len(md.requests)
        md.set("notice")
        assert not w.thread.is_alive() and calls.notices == [] and len(md.requests) == n


def test_watcher_on_auto_with_no_metadata_service_says_so_and_stops():
    calls = Calls()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        w = sn.Watcher("auto", calls.notice, base_url=f"http://127.0.0.1:{s.getsockname()[1]}", interval_s=0.1,
                       log=calls.log)
        w.start()
        w.thread.join(10)
    assert not w.thread.is_alive() and calls.notices == []
    assert calls.lines and "no cloud metadata service answers" in calls.lines[-1]


def test_an_error_in_the_callback_ends_the_watcher_with_a_line_not_a_traceback():
    calls = Calls()

    def boom(_n: Notice) -> None:
        raise RuntimeError("boom")

    with FakeMetadata("gcp") as md:
        md.set("notice")
        w = sn.Watcher("gcp", boom, base_url=md.url, interval_s=0.05, log=calls.log)
        hook_calls: list[object] = []
        old, threading.excepthook = threading.excepthook, hook_calls.append
        try:
            w.start()
            w.thread.join(5)
        finally:
            threading.excepthook = old
    assert hook_calls == [] and "internal error: RuntimeError: boom" in calls.lines[-1]


def test_the_huge_answer_really_is_a_well_formed_notice():
    # So the huge-answer refusals above are refusals of size, not of shape.
    assert sn.parse_gcp(ans(200, notice_body("gcp", pad=4 << 20))) is not None
    assert sn.parse_aws(ans(200, notice_body("aws", pad=4 << 20))) is not None


# --- how a person turns it on: orch.toml [spot] and submit --spot-notice ----------------------------
URL_ERROR = "spot.url must be an http:// URL like http://169.254.169.254, got "


@pytest.mark.parametrize("toml,message", [
    ("spot = 1\n", "{toml}: [spot] must be a table"),
    ("[spot]\nnotice = 'ec2'\n", "{toml}: spot.notice must be one of off, auto, aws, gcp, azure, got 'ec2'"),
    ("[spot]\nnotice = true\n", "orch.toml: spot.notice must be str, got True"),
    ("[spot]\nurl = 'ftp://169.254.169.254'\n", "{toml}: " + URL_ERROR + "'ftp://169.254.169.254'"),
    ("[spot]\nurl = 'http://'\n", "{toml}: " + URL_ERROR + "'http://'"),
    ("[spot]\nurl = 'http://x:99999'\n", "{toml}: " + URL_ERROR + "'http://x:99999'"),
    ("[spot]\nurl = 'http://a b'\n", "{toml}: " + URL_ERROR + "'http://a b'"),
    ("[spot]\ninterval_s = 0\n", "{toml}: spot.interval_s must be a number 0.05..86400, got 0"),
    ("[spot]\ninterval_s = nan\n", "{toml}: spot.interval_s must be a number 0.05..86400, got nan"),
    ("[spot]\ninterval_s = '5'\n", "orch.toml: spot.interval_s must be int or float, got '5'"),
])
def test_a_bad_spot_table_exits_2_naming_the_key_and_writes_nothing(orch, toml, message):
    orch.write_config(toml)
    for args in (["status"], ["submit", "--name", "s", "--", "true"]):
        p = orch(*args)
        assert (p.returncode, p.stdout, p.stderr) == (2, "", f"orch: {message.format(toml=orch.home / 'orch.toml')}\n")
    assert not orch.runs.exists() and not (orch.home / "orch.db").exists()


def test_a_good_spot_table_is_read():
    from orchestrator.core.config import Config, _load_spot

    cfg = Config(home=None, runs_root=None, trash=None, db_url="")  # type: ignore[arg-type]
    assert (cfg.spot_notice, cfg.spot_url, cfg.spot_interval_s) == ("off", None, 5.0)  # off by default
    _load_spot(cfg, {"spot": {"notice": "auto", "url": "http://127.0.0.1:8080/x", "interval_s": 2}}, None)
    assert (cfg.spot_notice, cfg.spot_url, cfg.spot_interval_s) == ("auto", "http://127.0.0.1:8080/x", 2.0)


def test_submit_with_an_unknown_spot_notice_is_a_usage_error_before_anything_exists(orch):
    p = orch("submit", "--name", "s", "--spot-notice", "ec2", "--", "true")
    assert p.returncode == 2
    assert "Invalid value for '--spot-notice': 'ec2' is not one of 'off', 'auto', 'aws', 'gcp', 'azure'." \
        in p.stderr
    assert not orch.home.exists()


def test_the_wrapper_gets_the_watcher_flags_only_when_a_watcher_is_on(tmp_path):
    from orchestrator.backends.base import SubmitSpec

    spec = SubmitSpec(job="j", attempt=1, token="t", run_dir=tmp_path, command=("true",))
    assert not any(a.startswith("--spot") for a in spec.wrapper_argv())
    on = SubmitSpec(job="j", attempt=1, token="t", run_dir=tmp_path, command=("true",), spot_notice="gcp",
                    spot_url="http://127.0.0.1:1", spot_interval_s=0.5)
    argv = on.wrapper_argv()
    assert argv[argv.index("--") - 6:argv.index("--")] == ["--spot-notice", "gcp", "--spot-interval", "0.5",
                                                           "--spot-url", "http://127.0.0.1:1"]
