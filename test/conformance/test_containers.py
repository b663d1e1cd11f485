"""Multi-container sandboxes through the official client (issue 19): ``Sandbox.run(containers=[...])``
with a busybox primary and a python sidecar. Each container is its own root filesystem from its
own image, and both share the sandbox's network (they reach each other on 127.0.0.1). The client
targets a container by name (``container=`` on exec, files and logs), echoes the spec's rows in
``sandbox.containers`` (name, primary, image) and their observed state in
``sandbox.container_statuses``; an unknown container name is the client's not-found error with
reason ``CWSANDBOX_CONTAINER_NOT_FOUND``; the primary's exit ends the sandbox. Every data call is
made on the direct data plane (AUTO, the client's default) and through the gateway (GATEWAY).
"""

from __future__ import annotations

import time

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox import Container, Sandbox, SandboxStatus  # noqa: E402
from cwsandbox.exceptions import SandboxNotFoundError  # noqa: E402

pytestmark = pytest.mark.usefixtures("client")

RES = {"cpu": "250m", "memory": "256Mi"}
# The primary prints a line and waits for /tmp/stop in its own filesystem, then exits 0
# (a non-zero exit would be restarted within the restart limit first).
PRIMARY = "echo primary-up; while [ ! -f /tmp/stop ]; do sleep 0.2; done; echo primary-done"
# The sidecar serves HTTP on the sandbox's loopback (-u: its first line reaches the log at once).
SIDECAR = ["-u", "-m", "http.server", "8000", "--bind", "127.0.0.1"]
MODES = ["auto", "gateway"]
TERMINAL = {SandboxStatus.COMPLETED, SandboxStatus.FAILED, SandboxStatus.TERMINATED}


def _group(primary_script: str = PRIMARY) -> list[Container]:
    return [
        Container(name="app", image="busybox", command="sh", args=["-c", primary_script], primary=True, resources=RES),
        Container(name="side", image="python:3.11", command="python", args=SIDECAR, resources=RES),
    ]


@pytest.fixture
def group(new_sandbox):
    """A running two-container sandbox (busybox primary ``app``, python sidecar ``side``)."""
    sb = new_sandbox(containers=_group(), tags=["containers"])
    sb.wait(timeout=180)
    return sb


def _out(sb: Sandbox, cmd: list[str], **kw) -> str:
    res = sb.exec(cmd, **kw).result(timeout=60)
    assert res.returncode == 0, f"{cmd} {kw}: exit {res.returncode}, stderr {res.stderr!r}"
    return res.stdout


def _until(pred, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_exec_files_and_logs_per_container(group, mode):
    sb = Sandbox.from_id(group.sandbox_id, data_plane_mode=mode).result(timeout=20)
    # exec: the primary by default and by name; the sidecar by name; each its own image.
    assert _out(sb, ["sh", "-c", "command -v python || echo none"]).strip() == "none"
    assert _out(sb, ["sh", "-c", "command -v python || echo none"], container="app").strip() == "none"
    assert _out(sb, ["python", "-c", "print(6 * 7)"], container="side").strip() == "42"
    # One network: the primary reaches the sidecar's server on 127.0.0.1.
    listing = _until(
        lambda: sb.exec(["wget", "-qO-", "http://127.0.0.1:8000/"], container="app").result(timeout=30).stdout,
        "the sidecar's HTTP server seen from the primary",
    )
    assert "Directory listing" in listing

    # files: the same path in each container is its own file.
    path = f"/tmp/owner-{mode}"
    sb.write_file(path, b"app-bytes", container="app").result(timeout=30)
    sb.write_file(path, b"side-bytes", container="side").result(timeout=30)
    assert sb.read_file(path, container="app").result(timeout=30) == b"app-bytes"
    assert sb.read_file(path).result(timeout=30) == b"app-bytes"
    assert sb.read_file(path, container="side").result(timeout=30) == b"side-bytes"
    assert _out(sb, ["cat", path], container="side") == "side-bytes"

    # logs: each container's own output.
    app_log = "".join(sb.stream_logs(container="app", timeout_seconds=30))
    side_log = "".join(_until(lambda: list(sb.stream_logs(container="side", timeout_seconds=30)), "the sidecar's log"))
    assert "primary-up" in app_log and "Serving HTTP" not in app_log
    assert "Serving HTTP" in side_log and "primary-up" not in side_log
    assert "primary-up" in "".join(sb.stream_logs(timeout_seconds=30))


@pytest.mark.timeout(240)
def test_rows_and_statuses(group):
    got = Sandbox.from_id(group.sandbox_id).result(timeout=20)
    rows = [(c.name, c.primary, c.image) for c in got.containers]
    assert rows == [("app", True, "busybox"), ("side", False, "python:3.11")]

    def running():
        sb = Sandbox.from_id(group.sandbox_id).result(timeout=20)
        states = {s.name: s.state for s in sb.container_statuses}
        return states if states == {"app": SandboxStatus.RUNNING, "side": SandboxStatus.RUNNING} else None

    _until(running, "both containers RUNNING in container_statuses")
    # list echoes the same rows.
    listed = [s for s in Sandbox.list(tags=["containers"]).result(timeout=30) if s.sandbox_id == group.sandbox_id]
    assert [c.name for c in listed[0].containers] == ["app", "side"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", MODES)
def test_unknown_container_is_not_found(group, mode):
    sb = Sandbox.from_id(group.sandbox_id, data_plane_mode=mode).result(timeout=20)
    for call in (
        lambda: sb.exec(["true"], container="nope").result(timeout=30),
        lambda: sb.read_file("/etc/hostname", container="nope").result(timeout=30),
        lambda: sb.write_file("/tmp/x", b"x", container="nope").result(timeout=30),
        lambda: "".join(sb.stream_logs(container="nope", timeout_seconds=10)),
    ):
        with pytest.raises(SandboxNotFoundError) as ei:
            call()
        assert ei.value.reason == "CWSANDBOX_CONTAINER_NOT_FOUND", repr(ei.value)
        assert (ei.value.metadata or {}).get("container") == "nope", repr(ei.value)


@pytest.mark.timeout(300)
def test_primary_exit_ends_the_sandbox(new_sandbox):
    # The primary exits 0 as soon as it is told to; the sidecar would serve forever, but the
    # primary's exit ends the sandbox (COMPLETED, its exit code) and stops the sidecar.
    sb = new_sandbox(containers=_group(), tags=["containers"])
    sb.wait(timeout=180)
    sb.write_file("/tmp/stop", b"", container="app").result(timeout=30)
    sb.wait_until_complete(timeout=120).result(timeout=130)
    ended = _until(
        lambda: (s := Sandbox.from_id(sb.sandbox_id).result(timeout=20)).status in TERMINAL and s,
        "the sandbox to end",
    )
    assert ended.status == SandboxStatus.COMPLETED, (ended.status, ended.status_reason)
    statuses = {s.name: s for s in ended.container_statuses}
    assert statuses["app"].state == SandboxStatus.COMPLETED and statuses["app"].exit_code == 0, statuses
    assert statuses["side"].state in {SandboxStatus.COMPLETED, SandboxStatus.FAILED}, statuses


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", MODES)
def test_single_container_names(new_sandbox, mode):
    """A single-container sandbox: its container is "main" (the client's name for it), by that
    name or none; any other name is not found, naming it; one status row, the primary's."""
    sb = new_sandbox("sleep", "600", container_image="busybox", tags=["containers"])
    sb.wait(timeout=120)
    sb = Sandbox.from_id(sb.sandbox_id, data_plane_mode=mode).result(timeout=20)
    assert [c.name for c in sb.containers] == ["main"]
    assert _out(sb, ["echo", "hi"], container="main") == "hi\n"
    with pytest.raises(SandboxNotFoundError) as ei:
        sb.exec(["true"], container="side").result(timeout=30)
    assert ei.value.reason == "CWSANDBOX_CONTAINER_NOT_FOUND", repr(ei.value)
    assert (ei.value.metadata or {}).get("container") == "side", repr(ei.value)
    rows = _until(lambda: Sandbox.from_id(sb.sandbox_id).result(timeout=20).container_statuses, "a status row")
    assert [(r.name, r.state) for r in rows] == [("main", SandboxStatus.RUNNING)]
