"""sandboxd_ext against a local HTTP server that plays SandboxStateService over REST: it checks
paths, headers and bodies and answers as the gateway documents (google.rpc.Status errors)."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import sandboxd_ext as ext

KEY = "sbx_test_key"


def _status(code: int, message: str, reason: str | None = None, *extra: dict) -> dict:
    details = []
    if reason:
        details.append({"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                        "domain": "cwsandbox.com", "metadata": {"sandbox_id": "x"}})
    details.extend(extra)
    return {"code": code, "message": message, "details": details}


class FakeState:
    """Routes: (path) -> (HTTP status, JSON body or raw bytes). Records every request."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, object]] = {}
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                fake.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(raw or b"null")})
                status, body = fake.routes.get(self.path, (404, _status(5, "no route", "CWSANDBOX_ROUTE_NOT_FOUND")))
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def last(self) -> dict:
        return self.requests[-1]


@pytest.fixture
def fake(monkeypatch):
    f = FakeState()
    monkeypatch.setenv("CWSANDBOX_BASE_URL", f.url)
    monkeypatch.setenv("CWSANDBOX_API_KEY", KEY)
    yield f
    f.close()


class FakeSandbox:
    """Stands for the official client's Sandbox: only sandbox_id matters."""

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id


def test_pause_with_environment_credentials(fake):
    fake.routes["/v1/sandboxes/sb-1:pause"] = (200, {"status": {
        "sandboxId": "sb-1", "resourcesReleased": True, "autoResume": True, "pausedAt": "2026-01-02T03:04:05.123456789Z",
        "checkpointBytes": "4194304"}})
    st = ext.pause("sb-1")
    assert st == ext.PauseStatus(sandbox_id="sb-1", resources_released=True, auto_resume=True, lifetime_held=False,
                                 paused_at=datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc), checkpoint_bytes=4 << 20)
    req = fake.last
    assert req["path"] == "/v1/sandboxes/sb-1:pause"
    assert req["headers"]["Authorization"] == f"Bearer {KEY}"
    assert req["headers"]["Content-Type"] == "application/json"
    assert req["body"] == {}, "unset options must not be sent"


def test_pause_options_and_sandbox_object(fake):
    fake.routes["/v1/sandboxes/sb-2:pause"] = (200, {"status": {"sandboxId": "sb-2"}})
    st = ext.pause(FakeSandbox("sb-2"), release_resources=False, auto_resume=False)
    assert fake.last["body"] == {"releaseResources": False, "autoResume": False}
    # protojson leaves defaults out: a frozen pause without auto-resume.
    assert st == ext.PauseStatus("sb-2", False, False, False, None, 0)
    ext.pause("sb-2", release_resources=True)
    assert fake.last["body"] == {"releaseResources": True}


def test_explicit_client_overrides_environment(fake, monkeypatch):
    monkeypatch.setenv("CWSANDBOX_BASE_URL", "http://127.0.0.1:1")  # nothing listens there
    fake.routes["/v1/sandboxes/sb-1:resume"] = (200, {"sandboxId": "sb-1", "deadline": "2026-01-02T04:00:00Z"})
    c = ext.StateClient(base_url=fake.url + "/", api_key="other-key", timeout=5)
    res = c.resume("sb-1")
    assert res == ext.ResumeResult("sb-1", datetime(2026, 1, 2, 4, tzinfo=timezone.utc))
    assert fake.last["headers"]["Authorization"] == "Bearer other-key"
    assert fake.last["body"] == {}
    assert "other-key" not in repr(c)


def test_no_key_sends_no_authorization(fake, monkeypatch):
    monkeypatch.delenv("CWSANDBOX_API_KEY")
    fake.routes["/v1/sandboxes/sb-1:resume"] = (200, {"sandboxId": "sb-1"})
    ext.resume("sb-1")
    assert "Authorization" not in fake.last["headers"]


def test_official_client_auth_headers(fake):
    cws = pytest.importorskip("cwsandbox")
    fake.routes["/v1/sandboxes/sb-1:resume"] = (200, {"sandboxId": "sb-1"})
    ext.resume("sb-1", auth=cws.AuthHeaders(headers={"Authorization": "Bearer from-auth"}, strategy="api_key"))
    assert fake.last["headers"]["Authorization"] == "Bearer from-auth"


def test_sandbox_id_is_escaped(fake):
    fake.routes["/v1/sandboxes/a%2Fb%3Ac:resume"] = (200, {"sandboxId": "a/b:c"})
    assert ext.resume("a/b:c").sandbox_id == "a/b:c"
    assert fake.last["path"] == "/v1/sandboxes/a%2Fb%3Ac:resume"


def test_fork(fake):
    fake.routes["/v1/sandboxes/sb-1:fork"] = (200, {"forks": [{"sandboxId": "f-1"}, {"sandboxId": "f-2"}, {"sandboxId": "f-3"}]})
    assert ext.fork(FakeSandbox("sb-1"), count=3, request_id="r-1") == ["f-1", "f-2", "f-3"]
    assert fake.last["body"] == {"count": 3, "requestId": "r-1"}
    ext.fork("sb-1", count=3)
    assert fake.last["body"] == {"count": 3}


def test_fork_partial_failure(fake):
    fake.routes["/v1/sandboxes/sb-1:fork"] = (200, {"forks": [
        {"sandboxId": "f-1"},
        {"sandboxId": "f-2", "error": {"code": "UNAVAILABLE", "reason": "CWSANDBOX_RUNNER_UNAVAILABLE", "message": "runner gone"}},
    ]})
    with pytest.raises(ext.PartialForkError) as ei:
        ext.fork("sb-1", count=2)
    assert ei.value.sandbox_ids == ["f-1"]
    assert ei.value.failures == [ext.ForkFailure("f-2", "UNAVAILABLE", "CWSANDBOX_RUNNER_UNAVAILABLE", "runner gone")]
    assert "runner gone" in str(ei.value)
    # Fewer forks than asked for is a failure too, not a silent short list.
    with pytest.raises(ext.PartialForkError) as ei:
        ext.fork("sb-1", count=3)
    assert ei.value.sandbox_ids == ["f-1"] and len(ei.value.failures) == 2


def test_resume_on_runners(fake):
    fake.routes["/v1/sandboxes/sb-1:resume"] = (200, {"sandboxId": "sb-1", "deadline": "2026-01-02T04:00:00Z",
                                                      "runnerId": "r2", "movedFrom": "r1"})
    res = ext.resume(FakeSandbox("sb-1"), runner_ids=["r2", "r3"])
    assert res == ext.ResumeResult("sb-1", datetime(2026, 1, 2, 4, tzinfo=timezone.utc), runner_id="r2", moved_from="r1")
    assert fake.last["body"] == {"runnerIds": ["r2", "r3"]}
    # In place: the runner, no move (protojson leaves the empty moved_from out).
    fake.routes["/v1/sandboxes/sb-1:resume"] = (200, {"sandboxId": "sb-1", "runnerId": "r1"})
    res = ext.resume("sb-1")
    assert res.runner_id == "r1" and res.moved_from == ""
    assert fake.last["body"] == {}
    n = len(fake.requests)
    for bad, exc in (("r2", TypeError), ([""], ValueError), ([3], ValueError)):
        with pytest.raises(exc):
            ext.resume("sb-1", runner_ids=bad)
    assert len(fake.requests) == n


def test_fork_on_runners(fake):
    fake.routes["/v1/sandboxes/sb-1:fork"] = (200, {"forks": [{"sandboxId": "f-1", "runnerId": "r2"},
                                                              {"sandboxId": "f-2", "runnerId": "r3"}]})
    assert ext.fork_placed("sb-1", count=2, runner_ids=("r2", "r3")) == [ext.ForkedSandbox("f-1", "r2"), ext.ForkedSandbox("f-2", "r3")]
    assert fake.last["body"] == {"count": 2, "runnerIds": ["r2", "r3"]}
    assert ext.fork("sb-1", count=2, runner_ids=["r2"]) == ["f-1", "f-2"]
    assert fake.last["body"] == {"count": 2, "runnerIds": ["r2"]}
    fake.routes["/v1/sandboxes/sb-1:fork"] = (200, {"forks": [
        {"sandboxId": "f-1", "runnerId": "r2"},
        {"sandboxId": "f-2", "error": {"code": "RESOURCE_EXHAUSTED", "reason": "CWSANDBOX_RESOURCE_EXHAUSTED", "message": "full"}},
    ]})
    with pytest.raises(ext.PartialForkError) as ei:
        ext.fork_placed("sb-1", count=2, runner_ids=["r2"])
    assert ei.value.sandbox_ids == ["f-1"] and ei.value.forks == [ext.ForkedSandbox("f-1", "r2")]
    n = len(fake.requests)
    with pytest.raises(TypeError):
        ext.fork("sb-1", runner_ids="r2")
    assert len(fake.requests) == n


@pytest.mark.parametrize("count", [0, -1, 101, True, 1.5, "2"])
def test_fork_bad_count_sends_nothing(fake, count):
    with pytest.raises(ValueError):
        ext.fork("sb-1", count=count)
    assert fake.requests == []


def test_fork_sandboxes_uses_official_from_id(fake, monkeypatch):
    cws = pytest.importorskip("cwsandbox")
    fake.routes["/v1/sandboxes/sb-1:fork"] = (200, {"forks": [{"sandboxId": "f-1"}, {"sandboxId": "f-2"}]})
    calls = []

    class Ref:
        def __init__(self, sid):
            self.sid = sid

        def result(self):
            return FakeSandbox(self.sid)

    def from_id(sid, **kw):
        calls.append((sid, kw))
        return Ref(sid)

    monkeypatch.setattr(cws.Sandbox, "from_id", staticmethod(from_id))
    got = ext.StateClient(api_key="k2").fork_sandboxes("sb-1", 2)
    assert [s.sandbox_id for s in got] == ["f-1", "f-2"]
    assert [c[0] for c in calls] == ["f-1", "f-2"]
    assert calls[0][1]["base_url"] == fake.url
    assert calls[0][1]["auth"].headers == {"Authorization": "Bearer k2"}


def test_update_lifetime(fake):
    fake.routes["/v1/sandboxes/sb-1:updateLifetime"] = (200, {"deadline": "2026-01-02T05:00:00Z", "maxLifetimeSeconds": "7200"})
    lt = ext.update_lifetime("sb-1", extend_by=3600)
    assert lt == ext.Lifetime(7200, datetime(2026, 1, 2, 5, tzinfo=timezone.utc))
    assert fake.last["body"] == {"extendBySeconds": 3600}
    ext.update_lifetime("sb-1", max_lifetime=timedelta(hours=2))
    assert fake.last["body"] == {"maxLifetimeSeconds": 7200}
    ext.update_lifetime("sb-1", extend_by=-300)
    assert fake.last["body"] == {"extendBySeconds": -300}
    n = len(fake.requests)
    for kw in ({}, {"extend_by": 1, "max_lifetime": 2}, {"extend_by": timedelta(seconds=1.5)}):
        with pytest.raises(ValueError):
            ext.update_lifetime("sb-1", **kw)
    with pytest.raises(TypeError):
        ext.update_lifetime("sb-1", extend_by=1.5)
    assert len(fake.requests) == n


def test_bad_sandbox_argument():
    for bad in ("", None, 3, FakeSandbox("")):
        with pytest.raises(ValueError):
            ext.pause(bad, base_url="http://127.0.0.1:1")


def test_errors_carry_reason_and_official_classes(fake):
    cwx = pytest.importorskip("cwsandbox.exceptions")
    r = fake.routes
    r["/v1/sandboxes/gone:pause"] = (404, _status(5, "sandbox gone not found", "CWSANDBOX_SANDBOX_NOT_FOUND"))
    r["/v1/sandboxes/paused:pause"] = (400, _status(9, "sandbox is PAUSED", "CWSANDBOX_SANDBOX_NOT_RUNNING"))
    r["/v1/sandboxes/runc:pause"] = (400, _status(9, "runtime class runc cannot; gvisor can", "CWSANDBOX_CHECKPOINT_NOT_SUPPORTED"))
    r["/v1/sandboxes/runc:fork"] = r["/v1/sandboxes/runc:pause"]
    r["/v1/sandboxes/x:updateLifetime"] = (400, _status(3, "bad lifetime", "CWSANDBOX_INVALID_REQUEST", {
        "@type": "type.googleapis.com/google.rpc.BadRequest",
        "fieldViolations": [{"field": "max_lifetime_seconds", "description": "above the policy's 7200"}]}))
    r["/v1/sandboxes/x:pause"] = (401, _status(16, "no key", "CWSANDBOX_UNAUTHENTICATED"))
    r["/v1/sandboxes/x:resume"] = (503, _status(14, "runner down", "CWSANDBOX_RUNNER_UNAVAILABLE", {
        "@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.500s"}))
    r["/v1/sandboxes/x:fork"] = (501, _status(12, "ForkSandbox is not built yet", "CWSANDBOX_NOT_IMPLEMENTED"))
    r["/v1/sandboxes/proxy:resume"] = (502, b"<html>bad gateway</html>")

    with pytest.raises(ext.SandboxNotFound) as ei:
        ext.pause("gone")
    e = ei.value
    assert isinstance(e, cwx.SandboxNotFoundError) and isinstance(e, cwx.CWSandboxError)
    assert (e.code, e.reason, e.http_status, e.sandbox_id) == ("NOT_FOUND", "CWSANDBOX_SANDBOX_NOT_FOUND", 404, "gone")
    assert e.metadata == {"sandbox_id": "x"} and "not found" in str(e)

    with pytest.raises(ext.SandboxNotRunning) as ei:
        ext.pause("paused")
    assert isinstance(ei.value, cwx.SandboxNotRunningError) and ei.value.reason == "CWSANDBOX_SANDBOX_NOT_RUNNING"

    for call in (lambda: ext.pause("runc", release_resources=True), lambda: ext.fork("runc")):
        with pytest.raises(ext.CheckpointNotSupportedError) as ei:
            call()
        assert isinstance(ei.value, cwx.SandboxError) and not isinstance(ei.value, cwx.SandboxNotRunningError)
        assert ei.value.code == "FAILED_PRECONDITION" and "gvisor" in str(ei.value)

    with pytest.raises(ext.InvalidRequestError) as ei:
        ext.update_lifetime("x", max_lifetime=9999)
    assert isinstance(ei.value, cwx.CWSandboxValidationError)
    fv = ei.value.field_violations[0]
    assert (fv.field, fv.description) == ("max_lifetime_seconds", "above the policy's 7200")

    with pytest.raises(ext.AuthenticationError) as ei:
        ext.pause("x")
    assert isinstance(ei.value, cwx.CWSandboxAuthenticationError)

    with pytest.raises(ext.UnavailableError) as ei:
        ext.resume("x")
    assert ei.value.retry_delay == timedelta(seconds=1.5) and ei.value.reason == "CWSANDBOX_RUNNER_UNAVAILABLE"

    with pytest.raises(ext.UnimplementedError) as ei:
        ext.fork("x")
    assert ei.value.code == "UNIMPLEMENTED" and ei.value.http_status == 501

    with pytest.raises(ext.UnavailableError) as ei:
        ext.resume("proxy")
    assert ei.value.http_status == 502 and "bad gateway" in str(ei.value)

    # A path the server has no route for (an older sandboxd): unimplemented, not "sandbox not found".
    with pytest.raises(ext.UnimplementedError):
        ext.resume("no-route")


def test_untrusted_domain_reason_does_not_pick_a_class(fake):
    fake.routes["/v1/sandboxes/x:pause"] = (400, {"code": 9, "message": "m", "details": [
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "CWSANDBOX_CHECKPOINT_NOT_SUPPORTED", "domain": "evil.example"}]})
    with pytest.raises(ext.SandboxdError) as ei:
        ext.pause("x")
    assert type(ei.value) is ext.SandboxdError and ei.value.reason == "CWSANDBOX_CHECKPOINT_NOT_SUPPORTED"


def test_unreachable_server_is_unavailable(monkeypatch):
    monkeypatch.setenv("CWSANDBOX_BASE_URL", "http://127.0.0.1:1")
    with pytest.raises(ext.UnavailableError) as ei:
        ext.resume("sb-1", timeout=5)
    assert ei.value.code == "UNAVAILABLE"


def test_bad_base_url():
    with pytest.raises(ValueError):
        ext.StateClient(base_url="ftp://x")


def test_without_the_official_client(fake):
    """Standard library only: with cwsandbox unimportable the env key is sent and errors keep
    their classes (stand-ins for the official ones)."""
    import os
    import pathlib
    import subprocess
    import sys

    fake.routes["/v1/sandboxes/sb-1:pause"] = (200, {"status": {"sandboxId": "sb-1", "resourcesReleased": True}})
    fake.routes["/v1/sandboxes/gone:pause"] = (404, _status(5, "not found", "CWSANDBOX_SANDBOX_NOT_FOUND"))
    script = """
import sys
sys.modules["cwsandbox"] = None  # import cwsandbox now raises ImportError
import sandboxd_ext as ext
assert ext.pause("sb-1").resources_released
try:
    ext.pause("gone")
except ext.SandboxNotFound as e:
    assert e.reason == "CWSANDBOX_SANDBOX_NOT_FOUND" and isinstance(e, Exception)
    print("ok")
"""
    src = str(pathlib.Path(ext.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    assert fake.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
