"""End-to-end conformance: the official ``cwsandbox`` client (pinned in requirements.txt) against a
``sandboxd dev`` started by the suite (see conftest.py).

Only the client's documented public API is used: ``Sandbox`` (run, wait, exec, read_file,
write_file, get_status, list, from_id, stop, delete, wait_until_complete), ``AuthHeaders`` for a
per-call key, and the exceptions in ``cwsandbox.exceptions``. Every sandbox carries the session's
unique tag; each test deletes what it created and the session sweeps the tag at the end.

Run: ``pytest -x -q test/conformance`` as root after ``make build`` (and ``make images``).
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
import uuid

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox import AuthHeaders, Sandbox, SandboxStatus  # noqa: E402
from cwsandbox.exceptions import (  # noqa: E402
    CWSandboxAuthenticationError,
    SandboxExecutionError,
    SandboxFailedError,
    SandboxFileError,
    SandboxNotFoundError,
    SandboxTerminatedError,
)

TERMINAL = {SandboxStatus.COMPLETED, SandboxStatus.FAILED, SandboxStatus.TERMINATED}
STARTING = {SandboxStatus.PENDING, SandboxStatus.CREATING}
START_TIMEOUT = 60  # seconds for a sandbox to reach RUNNING (images are local)
BUSYBOX = "busybox"

pytestmark = pytest.mark.usefixtures("client")


def _auth(key: str) -> AuthHeaders:
    return AuthHeaders(headers={"Authorization": f"Bearer {key}"}, strategy="api_key")


def _next_chunk(reader, timeout: float):
    """Next item of a client StreamReader, or raise AssertionError after TIMEOUT seconds."""
    out: queue.Queue = queue.Queue()

    def pull():
        try:
            out.put(("ok", next(reader)))
        except StopIteration:
            out.put(("eof", None))
        except BaseException as e:  # noqa: BLE001
            out.put(("err", e))

    threading.Thread(target=pull, daemon=True).start()
    try:
        kind, val = out.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no output chunk within {timeout}s") from None
    if kind == "err":
        raise val
    if kind == "eof":
        raise AssertionError("output stream ended early")
    return val


@pytest.fixture(scope="module")
def py_box(client, session_tag):
    """One sandbox on the client's default image (python:3.11), shared by read-only exec checks."""
    sb = Sandbox.run(tags=[session_tag, "py-box"])
    try:
        sb.wait(timeout=START_TIMEOUT)
        yield sb
    finally:
        try:
            sb.stop().result(timeout=40)
        except Exception:  # noqa: BLE001
            Sandbox.delete(sb.sandbox_id, missing_ok=True).result(timeout=30)


def _wait_status(sb_id: str, want: set, timeout: float, auth=None) -> SandboxStatus:
    """Poll GetSandbox (via from_id) until the status is in WANT; returns it."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = Sandbox.from_id(sb_id, auth=auth).result(timeout=20).status
        if seen in want:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"sandbox {sb_id}: status {seen} after {timeout}s, wanted one of {sorted(want)}")


# --- run / wait --------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_run_default_image_python(py_box):
    assert py_box.status == SandboxStatus.RUNNING
    assert py_box.runner_id, "GetSandbox status carries no runner_id"
    res = py_box.exec(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).result(timeout=30)
    assert (res.returncode, res.stdout) == (0, "3.11\n"), res


@pytest.mark.timeout(90)
def test_run_busybox_image(new_sandbox):
    sb = new_sandbox(container_image=BUSYBOX)
    assert sb.status == SandboxStatus.PENDING  # client-local until the first GetSandbox
    sb.wait(timeout=START_TIMEOUT)
    assert sb.status == SandboxStatus.RUNNING
    res = sb.exec(["busybox"]).result(timeout=30)
    assert "BusyBox v" in res.stdout + res.stderr, res
    sb.stop().result(timeout=40)
    assert sb.status in TERMINAL


# --- limits visible inside ---------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("cpu", "memory", "cpus", "mem_bytes"), [("500m", "256Mi", 1, 256 << 20), ("1500m", "1Gi", 2, 1 << 30)])
def test_limits_visible_inside(new_sandbox, cpu, memory, cpus, mem_bytes):
    """A program finds its limits the usual ways: nproc, os.cpu_count() and /proc/cpuinfo show
    ceil(CPU limit) CPUs (at most this host's), /proc/meminfo's MemTotal and the cgroup's own
    file (v2 memory.max, or v1 memory.limit_in_bytes) the memory limit."""
    sb = new_sandbox(resources={"cpu": cpu, "memory": memory})
    sb.wait(timeout=START_TIMEOUT)
    want = str(min(cpus, len(os.sched_getaffinity(0))))

    def out(argv):
        res = sb.exec(argv).result(timeout=30)
        assert res.returncode == 0, res
        return res.stdout.strip()

    assert out(["nproc"]) == want
    assert out(["python3", "-c", "import os; print(os.cpu_count())"]) == want
    assert out(["grep", "-c", "^processor", "/proc/cpuinfo"]) == want
    assert out(["grep", "MemTotal", "/proc/meminfo"]).split()[1] == str(mem_bytes >> 10)
    limit = out(["sh", "-c", "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"])
    assert limit == str(mem_bytes)
    res = sb.exec(["sh", "-c", "echo max > /sys/fs/cgroup/memory.max || echo -1 > /sys/fs/cgroup/memory/memory.limit_in_bytes"]).result(timeout=30)
    assert res.returncode != 0, f"the sandbox wrote its own cgroup limit: {res}"


# --- exec --------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_exec_stdout_stderr_exit_code(py_box):
    res = py_box.exec(["echo", "hello"]).result(timeout=30)
    assert (res.stdout, res.stderr, res.returncode) == ("hello\n", "", 0)
    res = py_box.exec(["sh", "-c", "echo out; echo err >&2; exit 7"]).result(timeout=30)
    assert (res.stdout, res.stderr, res.returncode) == ("out\n", "err\n", 7)
    assert res.stdout_bytes == b"out\n" and res.stderr_bytes == b"err\n"
    res = py_box.exec(["false"]).result(timeout=30)
    assert res.returncode == 1


@pytest.mark.timeout(60)
def test_exec_check_raises(py_box):
    ok = py_box.exec(["true"], check=True).result(timeout=30)
    assert ok.returncode == 0
    with pytest.raises(SandboxExecutionError) as ei:
        py_box.exec(["sh", "-c", "echo nope >&2; exit 3"], check=True).result(timeout=30)
    assert ei.value.exec_result is not None and ei.value.exec_result.returncode == 3
    assert ei.value.exec_result.stderr == "nope\n"


@pytest.mark.timeout(60)
def test_exec_cwd(py_box):
    assert py_box.exec(["pwd"], cwd="/tmp").result(timeout=30).stdout == "/tmp\n"
    d = f"/tmp/conformance cwd {uuid.uuid4().hex[:6]}"
    py_box.exec(["mkdir", "-p", d], check=True).result(timeout=30)
    res = py_box.exec(["sh", "-c", "pwd; ls"], cwd=d).result(timeout=30)
    assert res.stdout == f"{d}\n" and res.returncode == 0, res
    res = py_box.exec(["pwd"], cwd="/no/such/dir").result(timeout=30)
    assert res.returncode != 0


@pytest.mark.timeout(60)
def test_exec_streaming_output_is_incremental(py_box):
    n, gap = 5, 0.4
    proc = py_box.exec(["sh", "-c", f"for i in $(seq 1 {n}); do echo line$i; sleep {gap}; done"])
    start = time.monotonic()
    arrivals = []  # (seconds since start, chunk, process finished?)
    for chunk in proc.stdout:
        arrivals.append((time.monotonic() - start, chunk, proc.poll() is not None))
    res = proc.result(timeout=30)
    assert res.returncode == 0
    assert "".join(c for _, c, _ in arrivals) == "".join(f"line{i}\n" for i in range(1, n + 1))
    assert len(arrivals) >= 3, f"output arrived in {len(arrivals)} chunk(s), not incrementally: {arrivals}"
    assert not arrivals[0][2], "first chunk delivered only after the command had finished"
    span = arrivals[-1][0] - arrivals[0][0]
    assert span >= (n - 2) * gap, f"chunks not spread over time (span {span:.2f}s): {arrivals}"


@pytest.mark.timeout(60)
def test_exec_stdin_streaming(py_box):
    proc = py_box.exec(["cat"], stdin=True)
    assert proc.stdin is not None
    out = iter(proc.stdout)
    proc.stdin.write(b"ping\n").result(timeout=15)
    # cat echoes while stdin stays open: each line comes back before we send the next one.
    assert _next_chunk(out, 15) == "ping\n"
    proc.stdin.writeline("pong").result(timeout=15)
    assert _next_chunk(out, 15) == "pong\n"
    proc.stdin.close().result(timeout=15)  # EOF -> cat exits
    res = proc.result(timeout=30)
    assert res.returncode == 0
    assert res.stdout == "ping\npong\n"


@pytest.mark.timeout(60)
def test_exec_stdin_large_and_eof(py_box):
    data = os.urandom(300 * 1024)  # several 64 KiB stdin chunks
    proc = py_box.exec(["sh", "-c", "sha256sum | cut -d' ' -f1"], stdin=True)
    proc.stdin.write(data).result(timeout=30)
    proc.stdin.close().result(timeout=15)
    res = proc.result(timeout=30)
    assert (res.returncode, res.stdout.strip()) == (0, hashlib.sha256(data).hexdigest())


# --- files -------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [1024, 10 << 20, 40 << 20], ids=["1KiB", "10MiB", "40MiB"])
def test_write_read_file(py_box, size):
    data = os.urandom(size)
    path = f"/tmp/conformance-{uuid.uuid4().hex[:8]}-{size}.bin"
    try:
        py_box.write_file(path, data).result(timeout=120)
        # The sandbox itself sees exactly these bytes...
        res = py_box.exec(["sha256sum", path]).result(timeout=60)
        assert res.returncode == 0, res
        assert res.stdout.split()[0] == hashlib.sha256(data).hexdigest(), "file content in the sandbox differs"
        # ...and reading returns them (40 MiB exceeds the 32 MiB unary cap: streaming fallback).
        got = py_box.read_file(path).result(timeout=120)
        assert len(got) == size and got == data
    finally:
        py_box.exec(["rm", "-f", path]).result(timeout=30)


@pytest.mark.timeout(60)
def test_write_file_overwrites(py_box):
    path = f"/tmp/conformance-{uuid.uuid4().hex[:8]}.txt"
    py_box.write_file(path, b"first version, longer\n").result(timeout=30)
    py_box.write_file(path, b"second\n").result(timeout=30)
    assert py_box.read_file(path).result(timeout=30) == b"second\n"
    assert py_box.exec(["cat", path]).result(timeout=30).stdout == "second\n"


@pytest.mark.timeout(60)
def test_read_missing_file(py_box):
    path = f"/tmp/conformance-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxFileError) as ei:
        py_box.read_file(path).result(timeout=30)
    assert ei.value.reason == "CWSANDBOX_FILE_NOT_FOUND", ei.value
    assert ei.value.filepath == path, ei.value


# --- status, listing, stop/delete ----------------------------------------------------------------


@pytest.mark.timeout(60)
def test_get_status_transitions(new_sandbox):
    sb = new_sandbox("sh", "-c", "sleep 2", container_image=BUSYBOX)
    seen: list[SandboxStatus] = []
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        st = sb.get_status()
        if not seen or seen[-1] != st:
            seen.append(st)
        if st in TERMINAL:
            break
        time.sleep(0.05)
    rank = {SandboxStatus.PENDING: 0, SandboxStatus.CREATING: 1, SandboxStatus.RUNNING: 2}
    assert seen and seen[0] in STARTING | {SandboxStatus.RUNNING}, seen
    assert SandboxStatus.RUNNING in seen, f"never observed RUNNING: {seen}"
    assert seen[-1] == SandboxStatus.COMPLETED, f"main exited 0 but ended as {seen}"
    ranks = [rank.get(s, 3) for s in seen]
    assert ranks == sorted(ranks), f"status went backwards: {seen}"
    assert SandboxStatus.UNSPECIFIED not in seen


@pytest.mark.timeout(120)
def test_list_by_tag_and_status(new_sandbox, session_tag):
    t = f"list-{uuid.uuid4().hex[:8]}"
    live = new_sandbox(container_image=BUSYBOX, tags=[t, "live"])
    gone = new_sandbox(container_image=BUSYBOX, tags=[t, "gone"])
    live.wait(timeout=START_TIMEOUT)
    gone.wait(timeout=START_TIMEOUT)
    gone.stop().result(timeout=40)
    ended = gone.status
    assert ended in TERMINAL

    def ids(**kw):
        return {sb.sandbox_id for sb in Sandbox.list(**kw).result(timeout=30)}

    assert ids(tags=[session_tag, t]) == {live.sandbox_id}, "default list must hide terminal sandboxes"
    assert ids(tags=[t, "live"]) == {live.sandbox_id}, "tags are ANDed"
    assert ids(tags=[t, "no-such-tag"]) == set()
    assert ids(tags=[t], show_terminated=True) == {live.sandbox_id, gone.sandbox_id}
    assert ids(tags=[t], status="running") == {live.sandbox_id}
    # A terminal status filter widens the search without show_terminated.
    assert ids(tags=[t], status=ended.value) == {gone.sandbox_id}
    entries = {sb.sandbox_id: sb for sb in Sandbox.list(tags=[t], show_terminated=True).result(timeout=30)}
    assert entries[live.sandbox_id].status == SandboxStatus.RUNNING
    assert entries[gone.sandbox_id].status == ended
    assert set(entries[live.sandbox_id].tags) >= {session_tag, t, "live"}


@pytest.mark.timeout(90)
def test_stop(new_sandbox):
    sb = new_sandbox(container_image=BUSYBOX)
    sb.wait(timeout=START_TIMEOUT)
    t0 = time.monotonic()
    sb.stop().result(timeout=40)
    took = time.monotonic() - t0
    # The default command traps TERM and exits 0, so the stop is quick and the sandbox completes.
    assert sb.status in {SandboxStatus.COMPLETED, SandboxStatus.TERMINATED}, sb.status
    assert took < 15, f"stop of a TERM-trapping sandbox took {took:.1f}s"
    # Still readable after the stop (retention), in the same terminal state.
    again = Sandbox.from_id(sb.sandbox_id).result(timeout=20)
    assert again.status == sb.status
    # A client-initiated stop makes wait_until_complete raise SandboxTerminatedError (documented).
    with pytest.raises(SandboxTerminatedError):
        sb.wait_until_complete(timeout=10).result(timeout=20)
    # Stopping again is idempotent.
    sb.stop().result(timeout=20)


@pytest.mark.timeout(90)
def test_delete_by_id(new_sandbox):
    sb = new_sandbox(container_image=BUSYBOX)
    sb.wait(timeout=START_TIMEOUT)
    assert Sandbox.delete(sb.sandbox_id).result(timeout=30) is None
    st = _wait_status(sb.sandbox_id, TERMINAL, timeout=30)
    assert st in TERMINAL
    missing = f"no-such-sandbox-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxNotFoundError):
        Sandbox.delete(missing).result(timeout=30)
    Sandbox.delete(missing, missing_ok=True).result(timeout=30)
    with pytest.raises(SandboxNotFoundError):
        Sandbox.from_id(missing).result(timeout=30)


# --- main command outcomes ---------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_main_exit_zero_completes(new_sandbox):
    sb = new_sandbox("sh", "-c", "echo done; exit 0", container_image=BUSYBOX)
    sb.wait_until_complete(timeout=40).result(timeout=50)
    assert sb.status == SandboxStatus.COMPLETED
    assert sb.returncode == 0, "COMPLETED without exit_code 0 in GetSandbox"
    assert Sandbox.from_id(sb.sandbox_id).result(timeout=20).status == SandboxStatus.COMPLETED


@pytest.mark.timeout(90)
def test_main_keeps_failing_fails(new_sandbox):
    # Non-zero main is restarted (6 times, backoff up to 2 s) and then the sandbox FAILS, saying why.
    sb = new_sandbox("sh", "-c", "echo boom >&2; exit 3", container_image=BUSYBOX)
    with pytest.raises(SandboxFailedError) as ei:
        sb.wait_until_complete(timeout=60).result(timeout=70)
    assert sb.status == SandboxStatus.FAILED
    assert ei.value.sandbox_id == sb.sandbox_id
    reason = ei.value.status_reason or ""
    assert reason.startswith("RestartLimit: "), reason
    assert "exit" in reason and "3" in reason, reason
    got = Sandbox.from_id(sb.sandbox_id).result(timeout=20)
    assert got.status == SandboxStatus.FAILED
    assert got.status_reason == reason


@pytest.mark.timeout(60)
def test_lifetime_expiry(new_sandbox):
    # As the target documents (RUNNING -> TERMINATING -> COMPLETED at the lifetime; the client
    # counts such external kills as COMPLETED): wait_until_complete returns, with state_reason
    # LifetimeExceeded and no exit code, since the main command did not exit by itself (the
    # client's default command exits 0 on SIGTERM).
    t0 = time.monotonic()
    sb = new_sandbox(container_image=BUSYBOX, max_lifetime_seconds=3)
    sb.wait(timeout=START_TIMEOUT)
    assert sb.status == SandboxStatus.RUNNING
    sb.wait_until_complete(timeout=30).result(timeout=40)
    took = time.monotonic() - t0
    assert sb.status == SandboxStatus.COMPLETED, sb.status
    assert (sb.status_reason or "").startswith("LifetimeExceeded"), sb.status_reason
    assert sb.returncode is None, sb.returncode
    assert 2.5 <= took <= 20, f"lifetime 3 s, ended after {took:.1f}s"
    got = Sandbox.from_id(sb.sandbox_id).result(timeout=20)
    assert got.status == SandboxStatus.COMPLETED and got.status_reason.startswith("LifetimeExceeded: ")


@pytest.mark.timeout(60)
def test_completed_has_reason(new_sandbox):
    sb = new_sandbox("sh", "-c", "exit 0", container_image=BUSYBOX)
    sb.wait_until_complete(timeout=40).result(timeout=50)
    assert Sandbox.from_id(sb.sandbox_id).result(timeout=20).status_reason == "Completed"


@pytest.mark.timeout(90)
def test_unknown_image_fails(new_sandbox):
    image = f"sandboxd-conformance/no-such-image-{uuid.uuid4().hex[:8]}:v1"
    sb = new_sandbox(container_image=image)
    with pytest.raises(SandboxFailedError) as ei:
        sb.wait(timeout=60)
    assert sb.status == SandboxStatus.FAILED
    reason = ei.value.status_reason or ""
    assert reason.startswith("ImagePullFailed: "), f"status_reason should name the pull error, got {reason!r}"
    assert image in reason, reason
    assert sb.status_reason == reason


# --- authentication and organizations ----------------------------------------------------------


@pytest.mark.timeout(60)
def test_wrong_api_key(session_tag):
    bad = _auth(f"sbx-wrong-{uuid.uuid4().hex}")
    with pytest.raises(CWSandboxAuthenticationError):
        Sandbox.list(tags=[session_tag], auth=bad).result(timeout=30)
    with pytest.raises(CWSandboxAuthenticationError):
        Sandbox.run(tags=[session_tag], container_image=BUSYBOX, auth=bad)
    with pytest.raises(CWSandboxAuthenticationError):
        Sandbox.list(tags=[session_tag], auth=AuthHeaders(headers={}, strategy="none")).result(timeout=30)


@pytest.mark.timeout(120)
def test_other_org_sees_not_found(new_sandbox, other_org_key, session_tag):
    other = _auth(other_org_key)
    # The new key is picked up by the running server; give it a moment.
    deadline = time.monotonic() + 15
    while True:
        try:
            Sandbox.list(tags=[session_tag], auth=other).result(timeout=30)
            break
        except CWSandboxAuthenticationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)

    mine = new_sandbox(container_image=BUSYBOX)
    mine.wait(timeout=START_TIMEOUT)
    with pytest.raises(SandboxNotFoundError):
        Sandbox.from_id(mine.sandbox_id, auth=other).result(timeout=30)
    with pytest.raises(SandboxNotFoundError):
        Sandbox.delete(mine.sandbox_id, auth=other).result(timeout=30)
    assert mine.sandbox_id not in {s.sandbox_id for s in Sandbox.list(tags=[session_tag], auth=other).result(timeout=30)}
    assert mine.get_status() == SandboxStatus.RUNNING, "the other org's delete must not touch it"

    # The other org's key works for its own sandboxes, invisible to the first org.
    theirs = new_sandbox(container_image=BUSYBOX, auth=other)
    theirs.wait(timeout=START_TIMEOUT)
    assert theirs.exec(["echo", "hi"]).result(timeout=30).stdout == "hi\n"
    with pytest.raises(SandboxNotFoundError):
        Sandbox.from_id(theirs.sandbox_id).result(timeout=30)
    assert {s.sandbox_id for s in Sandbox.list(tags=[session_tag], auth=other).result(timeout=30)} == {theirs.sandbox_id}


# Last, so that `-x` reports everything above first: the client's own docs and examples run
# `python` (not `python3`), which the real python:3.11 image provides.
@pytest.mark.timeout(60)
def test_default_image_provides_python(py_box):
    res = py_box.exec(["python", "-c", "print(2 + 2)"]).result(timeout=30)
    assert (res.returncode, res.stdout) == (0, "4\n"), f"`python` missing from the python:3.11 image: {res}"
