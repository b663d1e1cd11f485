"""Pause, resume and fork (issue 21) through the official client and sandboxd_ext (sdk/python).

The official client sees a paused sandbox as ``SandboxStatus.PAUSED`` and runs exec on it as on
a running one; pausing, resuming and forking go through sandboxd's own SandboxStateService with
the same credentials (``sandboxd_ext``, from this tree).

Every test here skips while the server answers PauseSandbox (or, for the fork tests,
ForkSandbox) with UNIMPLEMENTED: the ``state_api`` fixture probes it once with an ID that does
not exist and skips on ``UNIMPLEMENTED`` (an implemented server answers NOT_FOUND). This skip
holds under SANDBOXD_CONFORMANCE_REQUIRED too: it marks a server without the feature, not a
broken environment. Once the server answers, the tests run; gvisor tests then need the gvisor
runtime class (runsc, ``make runsc``) and skip without it, or fail under
SANDBOXD_CONFORMANCE_REQUIRED.

The workload is a Python process holding state in memory: a random token drawn at start, a
counter ticking every 0.1 s, a value set over HTTP, an open file it appends to, and a listening
socket on port 8080 answering all of it as JSON (read from inside the sandbox with exec).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import urllib.request
import uuid

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox import Sandbox, SandboxStatus  # noqa: E402
from cwsandbox.exceptions import CWSandboxError  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
import sandboxd_ext  # noqa: E402

pytestmark = pytest.mark.usefixtures("client")

PYTHON = "python:3.11"
START_TIMEOUT = 120
TICK = 0.1

WORKLOAD = r"""
import http.server, json, os, socket, threading, time
token = os.urandom(8).hex()
state = {"count": 0, "value": ""}
log = open("/tmp/state.log", "a", buffering=1)

def tick():
    while True:
        state["count"] += 1
        time.sleep(0.1)

def my_ip():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # no packet is sent
        return s.getsockname()[0]
    finally:
        s.close()

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/set/"):
            state["value"] = self.path[5:]
        count = state["count"]  # read once: the tick thread may move it between the log line and the answer
        log.write("%d\n" % count)
        body = json.dumps({"token": token, "count": count, "value": state["value"], "ip": my_ip(), "pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

threading.Thread(target=tick, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""

# Reads the workload's state over its listening socket, from inside the sandbox.
PROBE = "import sys, urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080' + sys.argv[1], timeout=10).read().decode())"


def _required() -> bool:
    return os.environ.get("SANDBOXD_CONFORMANCE_REQUIRED", "") not in ("", "0", "false", "no")


def _need(msg: str) -> None:
    if _required():
        pytest.fail(f"{msg} (SANDBOXD_CONFORMANCE_REQUIRED is set)", pytrace=False)
    pytest.skip(msg)


def _probe(call, rpc: str) -> None:
    """Skips the test when the server answers RPC with UNIMPLEMENTED."""
    probe_id = f"conformance-probe-{uuid.uuid4().hex[:12]}"
    try:
        call(probe_id)
    except sandboxd_ext.UnimplementedError as e:
        pytest.skip(f"the server answers {rpc} with UNIMPLEMENTED ({e}): pause/resume/fork not built yet")
    except sandboxd_ext.SandboxNotFound:
        return
    pytest.fail(f"{rpc} of the unknown sandbox {probe_id} did not fail with NOT_FOUND", pytrace=False)


@pytest.fixture(scope="module")
def state_api(client, runtime_classes):
    """PauseSandbox and ResumeSandbox are served (else the module's tests skip)."""
    _probe(lambda i: sandboxd_ext.pause(i), "PauseSandbox")
    _probe(lambda i: sandboxd_ext.resume(i), "ResumeSandbox")


@pytest.fixture(scope="module")
def fork_api(state_api):
    _probe(lambda i: sandboxd_ext.fork(i), "ForkSandbox")


def _admin(server, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        server.base_url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {server.admin_key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read() or b"{}")


def _set_policy(server, policy: dict) -> None:
    runner = _admin(server, "GET", "/v1/sandbox/managedRunners/local")
    _admin(server, "PATCH", "/v1/sandbox/managedRunners/local?updateMask=policy", {"policy": policy, "etag": runner["etag"]})


@pytest.fixture(scope="module")
def runtime_classes(client):
    """The local runner's policy allows pinning runc and gvisor (the dev default allows no
    pin); reset when the module ends."""
    _set_policy(client, {"constraints": {"security": {"allowed_runtime_classes": ["runc", "gvisor"]}}})
    yield
    _set_policy(client, {})


def _start(run, runtime_class: str) -> Sandbox:
    try:
        sb = run("python3", "-c", WORKLOAD, container_image=PYTHON, runtime_class=runtime_class)
        sb.wait(timeout=START_TIMEOUT)
    except CWSandboxError as e:
        if runtime_class == "gvisor" and ("gvisor" in str(e) or "runtime class" in str(e).lower()):
            _need(f"the gvisor runtime class is not available here: {e}")
        raise
    _state(sb, timeout=60)  # listening
    return sb


def _state(sb: Sandbox, path: str = "/", timeout: float = 30) -> dict:
    """The workload's state (retried until its socket answers, within timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        r = sb.exec(["python3", "-c", PROBE, path]).result(timeout=60)
        if r.returncode == 0:
            return json.loads(r.stdout)
        if time.monotonic() > deadline:
            pytest.fail(f"the workload of {sb.sandbox_id} does not answer: exit {r.returncode}: {r.stderr}", pytrace=False)
        time.sleep(0.5)


def _status(sandbox_id: str):
    return Sandbox.from_id(sandbox_id).result().get_status()


@pytest.fixture
def run(session_tag):
    """Sandbox.run with the session tag and "pause"; every sandbox made (and every ID added to
    ``run.also``, e.g. forks) is stopped at test end and waited for until it ended, so that no
    teardown is still under way when the suite stops the server (a delete cut short by the
    server's exit left a sandbox's mounts behind)."""
    made: list[str] = []

    def start(*args, tags=(), **kw):
        sb = Sandbox.run(*args, tags=[session_tag, "pause", *tags], **kw)
        made.append(sb.sandbox_id)
        return sb

    start.also = made
    yield start
    for sid in made:
        try:
            Sandbox.from_id(sid).result(timeout=60).stop().result(timeout=120)
        except Exception:  # noqa: BLE001 - already gone, or the session sweep retries
            pass


@pytest.mark.timeout(300)
def test_gvisor_pause_resume_keeps_memory_files_and_socket(state_api, run):
    sb = _start(run, "gvisor")
    time.sleep(2)
    before = _state(sb)
    assert before["count"] >= 10, before

    st = sandboxd_ext.pause(sb)
    assert st.sandbox_id == sb.sandbox_id and st.resources_released, st
    assert st.checkpoint_bytes > 0 and st.auto_resume and st.paused_at is not None, st
    assert _status(sb.sandbox_id) == SandboxStatus.PAUSED
    listed = {s.sandbox_id: s for s in Sandbox.list(tags=["pause"]).result(timeout=60)}
    assert listed[sb.sandbox_id].status == SandboxStatus.PAUSED
    with pytest.raises(sandboxd_ext.SandboxNotRunning):
        sandboxd_ext.pause(sb)  # already paused

    time.sleep(4)  # running, the counter would gain ~40
    res = sandboxd_ext.resume(sb)
    assert res.sandbox_id == sb.sandbox_id and res.deadline is not None
    assert _status(sb.sandbox_id) == SandboxStatus.RUNNING
    after = _state(sb)
    assert after["token"] == before["token"] and after["pid"] == before["pid"], (before, after)
    assert before["count"] <= after["count"] < before["count"] + 25, f"the counter did not stop while paused: {before} {after}"
    assert after["ip"] == before["ip"], "a resumed sandbox keeps its address"
    # The open file took writes before and after the pause, through the same descriptor.
    r = sb.exec(["sh", "-c", "cat /tmp/state.log"]).result(timeout=60)
    counts = [int(x) for x in r.stdout.split()]
    assert before["count"] in counts and after["count"] in counts and counts == sorted(counts), counts

    # Resuming a running sandbox leaves it as it is.
    sandboxd_ext.resume(sb.sandbox_id)
    assert _state(sb)["token"] == before["token"]


@pytest.mark.timeout(300)
def test_gvisor_files_survive_two_resume_cycles(state_api, run):
    sb = _start(run, "gvisor")
    for i in range(2):
        sb.exec(["sh", "-c", f"echo cycle{i} >> /tmp/cycles"]).result(timeout=60)
        sandboxd_ext.pause(sb)
        sandboxd_ext.resume(sb)
    r = sb.exec(["cat", "/tmp/cycles"]).result(timeout=60)
    assert r.stdout.split() == ["cycle0", "cycle1"], r.stdout


@pytest.mark.timeout(300)
def test_gvisor_exec_resumes_an_auto_resume_sandbox(state_api, run):
    sb = _start(run, "gvisor")
    before = _state(sb)
    st = sandboxd_ext.pause(sb, auto_resume=True)
    assert st.auto_resume
    assert _status(sb.sandbox_id) == SandboxStatus.PAUSED
    after = _state(sb)  # exec on the paused sandbox: resumed first, same process
    assert after["token"] == before["token"], (before, after)
    assert _status(sb.sandbox_id) == SandboxStatus.RUNNING


@pytest.mark.timeout(300)
def test_gvisor_exec_on_paused_without_auto_resume_is_not_running(state_api, run):
    sb = _start(run, "gvisor")
    before = _state(sb)
    st = sandboxd_ext.pause(sb, auto_resume=False)
    assert not st.auto_resume
    with pytest.raises(CWSandboxError) as ei:
        sb.exec(["true"]).result(timeout=60)
    assert ei.value.reason == "CWSANDBOX_SANDBOX_NOT_RUNNING", repr(ei.value)
    assert _status(sb.sandbox_id) == SandboxStatus.PAUSED, "a refused exec must not resume it"
    sandboxd_ext.resume(sb)
    assert _state(sb)["token"] == before["token"]


@pytest.mark.timeout(420)
def test_gvisor_fork_three_continue_independently(fork_api, run):
    sb = _start(run, "gvisor")
    _state(sb, "/set/source")
    time.sleep(1)
    at_fork = _state(sb)
    ids = sandboxd_ext.fork(sb, count=3, request_id=f"conformance-{uuid.uuid4().hex}")
    run.also.extend(ids)
    assert len(ids) == 3 and len(set(ids)) == 3 and sb.sandbox_id not in ids, ids
    forks = [Sandbox.from_id(i).result() for i in ids]
    for f in forks:
        f.wait(timeout=START_TIMEOUT)
    # Each fork is the source's process (same token, counter from the fork point), and
    # each continues on its own: its own value, its own address.
    for i, f in enumerate(forks):
        s = _state(f, f"/set/fork{i}")
        assert s["token"] == at_fork["token"] and s["count"] >= at_fork["count"], (at_fork, s)
    states = [_state(f) for f in forks]
    assert [s["value"] for s in states] == ["fork0", "fork1", "fork2"], states
    src = _state(sb)
    assert src["value"] == "source" and src["count"] >= at_fork["count"], src
    ips = {s["ip"] for s in states} | {src["ip"]}
    assert len(ips) == 4, f"forks share an address: {states} {src}"
    for f in forks:
        assert f.get_status() == SandboxStatus.RUNNING


@pytest.mark.timeout(300)
def test_runc_pause_freezes_and_refuses_a_release(state_api, run):
    sb = _start(run, "runc")
    time.sleep(1)
    before = _state(sb)
    with pytest.raises(sandboxd_ext.CheckpointNotSupportedError) as ei:
        sandboxd_ext.pause(sb, release_resources=True)
    assert "gvisor" in str(ei.value), "the refusal names the runtime class that can"
    assert _status(sb.sandbox_id) == SandboxStatus.RUNNING

    st = sandboxd_ext.pause(sb)  # a freeze
    assert not st.resources_released and st.checkpoint_bytes == 0, st
    assert _status(sb.sandbox_id) == SandboxStatus.PAUSED
    time.sleep(3)
    sandboxd_ext.resume(sb)
    after = _state(sb)
    assert after["token"] == before["token"] and before["count"] <= after["count"] < before["count"] + 20, (before, after)

    st = sandboxd_ext.pause(sb, release_resources=False)
    assert not st.resources_released
    sandboxd_ext.resume(sb)


@pytest.mark.timeout(300)
def test_runc_fork_is_refused(fork_api, run):
    sb = _start(run, "runc")
    with pytest.raises(sandboxd_ext.CheckpointNotSupportedError) as ei:
        sandboxd_ext.fork(sb, count=2)
    assert "gvisor" in str(ei.value)
    assert _status(sb.sandbox_id) == SandboxStatus.RUNNING


def test_unknown_and_other_organization_sandboxes_are_not_found(state_api, other_org_key, run):
    sb = run(container_image="busybox")
    sb.wait(timeout=START_TIMEOUT)
    for call in (sandboxd_ext.pause, sandboxd_ext.resume):
        with pytest.raises(sandboxd_ext.SandboxNotFound):
            call(sb.sandbox_id, api_key=other_org_key)
    assert _status(sb.sandbox_id) == SandboxStatus.RUNNING


def test_update_lifetime_through_the_helper(run, other_org_key):
    """UpdateSandboxLifetime over REST with the official client's credentials (served today)."""
    sb = run(container_image="busybox", max_lifetime_seconds=600)
    sb.wait(timeout=START_TIMEOUT)
    lt = sandboxd_ext.update_lifetime(sb, extend_by=60)
    assert lt.max_lifetime_seconds == 660 and lt.deadline is not None, lt
    lt2 = sandboxd_ext.update_lifetime(sb.sandbox_id, max_lifetime=900)
    assert lt2.max_lifetime_seconds == 900 and (lt2.deadline - lt.deadline).total_seconds() == 240, (lt, lt2)
    with pytest.raises(sandboxd_ext.InvalidRequestError) as ei:
        sandboxd_ext.update_lifetime(sb, max_lifetime=0)
    assert ei.value.reason == "CWSANDBOX_INVALID_REQUEST" and ei.value.field_violations, repr(ei.value)
    with pytest.raises(sandboxd_ext.SandboxNotFound):
        sandboxd_ext.update_lifetime(sb, extend_by=60, api_key=other_org_key)
