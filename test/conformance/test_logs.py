"""Logs through the official client: stdout and stderr in the order written, and logs that
outlive the sandbox (COMPLETED, FAILED, TERMINATED) for the runner's retention window, through
``Sandbox.stream_logs`` (gateway and direct data plane) and the client's CLI ``cwsandbox logs``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
import grpc  # noqa: E402
from cwsandbox import Sandbox, SandboxStatus  # noqa: E402
from cwsandbox._proto import sandbox_pb2, sandbox_pb2_grpc  # noqa: E402
from cwsandbox.exceptions import SandboxFailedError, SandboxTerminatedError  # noqa: E402

pytestmark = pytest.mark.usefixtures("client")

ORDERED = "echo one; echo two >&2; echo three"
TERMINAL = {SandboxStatus.COMPLETED, SandboxStatus.FAILED, SandboxStatus.TERMINATED}


@pytest.fixture
def ended(new_sandbox):
    """Factory: runs a busybox sandbox with the given command and waits until it ended."""

    def run(script: str, *, stop: bool = False, **kw) -> Sandbox:
        sb = new_sandbox("sh", "-c", script, container_image="busybox", tags=["logs"], **kw)
        if stop:
            sb.wait(timeout=60)
            time.sleep(0.5)  # let the main command print before it is stopped
            sb.stop(graceful_shutdown_seconds=5).result(timeout=60)
        else:
            try:
                sb.wait_until_complete(timeout=90).result(timeout=100)
            except (SandboxFailedError, SandboxTerminatedError):
                pass
        deadline = time.monotonic() + 60
        while Sandbox.from_id(sb.sandbox_id).result(timeout=20).status not in TERMINAL:
            assert time.monotonic() < deadline, f"{sb.sandbox_id} did not end"
            time.sleep(0.2)
        return sb

    return run


def _logs(sandbox_id: str, mode: str = "auto", **kw) -> str:
    sb = Sandbox.from_id(sandbox_id, data_plane_mode=mode).result(timeout=20)
    return "".join(sb.stream_logs(timeout_seconds=30, **kw))


@pytest.mark.timeout(120)
def test_stdout_and_stderr_keep_their_order(sandboxd, ended):
    sb = ended(ORDERED)
    assert _logs(sb.sandbox_id) == "one\ntwo\nthree\n"
    # On the wire: next_log_offset grows by exactly the bytes of each entry, and the
    # entries' timestamps strictly increase.
    with grpc.insecure_channel(sandboxd.base_url.removeprefix("http://")) as ch:
        stub = sandbox_pb2_grpc.SandboxServiceStub(ch)
        md = (("authorization", f"Bearer {sandboxd.admin_key}"),)
        entries = list(stub.StreamLogs(sandbox_pb2.StreamLogsRequest(sandbox_id=sb.sandbox_id), metadata=md, timeout=30))
    assert b"".join(e.data for e in entries) == b"one\ntwo\nthree\n"
    offset, last = 0, None
    for e in entries:
        assert not e.HasField("error"), e.error
        assert e.next_log_offset == offset + len(e.data), (e.next_log_offset, offset, len(e.data))
        offset = e.next_log_offset
        t = e.timestamp.ToNanoseconds()
        assert last is None or t > last, f"timestamps do not increase: {last} then {t}"
        last = t


@pytest.mark.timeout(180)
@pytest.mark.parametrize("outcome", ["completed", "failed", "terminated"])
def test_logs_outlive_the_sandbox(ended, outcome):
    if outcome == "completed":
        sb, want, state = ended(ORDERED + "; exit 0"), "one\ntwo\nthree\n", SandboxStatus.COMPLETED
    elif outcome == "failed":
        # Exits non-zero until the restart limit (6 restarts): FAILED, with every run's output.
        sb, want, state = ended("echo run; echo boom >&2; exit 3"), "run\nboom\n" * 7, SandboxStatus.FAILED
    else:
        sb, want, state = ended("echo up; trap 'echo down; exit 0' TERM; sleep 3600 & wait", stop=True), "up\ndown\n", SandboxStatus.TERMINATED
    assert Sandbox.from_id(sb.sandbox_id).result(timeout=20).status == state
    for mode in ("gateway", "direct"):
        assert _logs(sb.sandbox_id, mode) == want, mode
    last = want.splitlines(keepends=True)[-1]
    assert _logs(sb.sandbox_id, tail_lines=1) == last
    stamped = _logs(sb.sandbox_id, tail_lines=1, timestamps=True)
    assert stamped.endswith(" " + last) and stamped.startswith("20"), stamped
    assert _logs(sb.sandbox_id, since_time=datetime.now(UTC)) == ""
    assert _logs(sb.sandbox_id, since_time=datetime(2000, 1, 1, tzinfo=UTC)) == want


@pytest.mark.timeout(120)
def test_follow_on_ended_sandbox_ends(sandboxd, ended):
    # Raw stub: the client itself refuses follow=True for a sandbox it watched end.
    sb = ended(ORDERED)
    with grpc.insecure_channel(sandboxd.base_url.removeprefix("http://")) as ch:
        stub = sandbox_pb2_grpc.SandboxServiceStub(ch)
        md = (("authorization", f"Bearer {sandboxd.admin_key}"),)
        entries = list(stub.StreamLogs(sandbox_pb2.StreamLogsRequest(sandbox_id=sb.sandbox_id, follow=True), metadata=md, timeout=30))
        assert b"".join(e.data for e in entries) == b"one\ntwo\nthree\n"
        session = entries[-1].log_session_id
        resumed = list(stub.StreamLogs(sandbox_pb2.StreamLogsRequest(
            sandbox_id=sb.sandbox_id, follow=True, resume_log_session_id=session, resume_log_offset=4), metadata=md, timeout=30))
        assert b"".join(e.data for e in resumed) == b"two\nthree\n"


@pytest.mark.timeout(120)
def test_cli_logs_of_ended_sandbox(sandboxd, ended):
    sb = ended(ORDERED)
    cli = [sys.executable, "-m", "cwsandbox"]
    env = dict(os.environ, CWSANDBOX_BASE_URL=sandboxd.base_url, CWSANDBOX_API_KEY=sandboxd.admin_key)
    for extra in ([], ["--tail", "1"], ["--data-plane-mode", "gateway"]):
        out = subprocess.run([*cli, "logs", sb.sandbox_id, *extra], env=env, capture_output=True, text=True, timeout=60)
        want = "three\n" if extra == ["--tail", "1"] else "one\ntwo\nthree\n"
        assert (out.returncode, out.stdout) == (0, want), (extra, out.returncode, out.stdout, out.stderr)
