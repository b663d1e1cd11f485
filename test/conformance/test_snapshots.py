"""File-system snapshots (issue 20) through the official ``cwsandbox`` client and its CLI.

A scratch volume (``FileSystemSnapshotOptions`` = a volume named ``workspace``, or a named
``ScratchVolumeOptions`` with explicit ``VolumeMount``s) is written, ``sandbox.snapshot()`` waits
until the snapshot is READY, and new sandboxes restore it (``file_system_snapshot_id`` /
``restore_from_snapshot_id``) and read the data back: one snapshot forks into several sandboxes,
each with its own copy. Also: the record's fields through ``get_snapshot`` / ``list_snapshots``,
delete (then NOT_FOUND, ``missing_ok``), ``stop(snapshot_on_stop=True)`` (trigger ON_DELETE, one
snapshot per scratch volume), another organization's snapshot (NOT_FOUND everywhere), and the
refusals with the exception classes the client raises for their CWSANDBOX_FSS_* reasons. The
``cwsandbox snapshots create|get|list|delete`` and ``cwsandbox stop --snapshot-on-stop``
commands run as subprocesses against the same server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from urllib.parse import urlparse

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
import grpc  # noqa: E402
from cwsandbox import (  # noqa: E402
    AuthHeaders,
    Container,
    FileSystemSnapshotOptions,
    FileSystemSnapshotStatus,
    FileSystemSnapshotTrigger,
    Sandbox,
    SandboxStatus,
    ScratchVolumeOptions,
    VolumeMount,
)
from cwsandbox._error_info import parse_error_info  # noqa: E402
from cwsandbox._proto import sandbox_pb2, sandbox_pb2_grpc  # noqa: E402
from cwsandbox.exceptions import (  # noqa: E402
    SandboxSnapshotError,
    SnapshotNotFoundError,
    SnapshotOnStopConflictError,
    SnapshotSizeExceededError,
)

pytestmark = pytest.mark.usefixtures("client")

BUSYBOX = "busybox"
START_TIMEOUT = 90  # a restore fills the volume before the containers start
SNAP_TIMEOUT = 120
MOUNT = "/workspace"
KEEPALIVE = ["-c", 'trap "exit 0" TERM INT; sleep infinity & wait']

# A tree with a nested directory, a symlink, a mode, an empty file and 1 MiB of random bytes:
# its listing and checksums must come back the same.
SEED = r"""
set -e
cd "$1"
mkdir -p sub/deeper
echo "$2" > token.txt
head -c 1048576 /dev/urandom > sub/random.bin
: > sub/deeper/empty
printf 'x' > sub/deeper/mode
chmod 0750 sub/deeper/mode
ln -s sub/random.bin link
"""
# Prints the tree's fingerprint: paths, types, modes, sizes and content checksums.
FINGERPRINT = r"""
cd "$1" && find . | sort | while read -r p; do
  if [ -L "$p" ]; then echo "$p L $(readlink "$p")";
  elif [ -d "$p" ]; then echo "$p D $(stat -c %a "$p")";
  else echo "$p F $(stat -c %a "$p") $(stat -c %s "$p") $(md5sum < "$p" | cut -d' ' -f1)"; fi
done
"""


def _auth(key: str) -> AuthHeaders:
    return AuthHeaders(headers={"Authorization": f"Bearer {key}"}, strategy="api_key")


def _sh(sb: Sandbox, script: str, *args: str) -> str:
    r = sb.exec(["sh", "-c", script, "sh", *args]).result(timeout=60)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}"
    return r.stdout


def _start(new_sandbox, **kw) -> Sandbox:
    if "containers" not in kw:
        kw.setdefault("container_image", BUSYBOX)
    sb = new_sandbox(tags=["snapshots"], **kw)
    sb.wait(timeout=START_TIMEOUT)
    return sb


def _wait_gone(snapshot_id: str, auth=None, timeout: float = 30) -> None:
    """Poll until the snapshot is NOT_FOUND; until then it may only be DELETING."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            snap = Sandbox.get_snapshot(snapshot_id, auth=auth).result(timeout=30)
        except SnapshotNotFoundError:
            return
        assert snap.status == FileSystemSnapshotStatus.DELETING, f"after delete: {snap!r}"
        assert time.monotonic() < deadline, f"{snapshot_id} still {snap.status} {timeout}s after delete"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def source(client, session_tag):
    """A running sandbox with the seeded tree in its ``workspace`` volume and a READY MANUAL
    snapshot of it: (sandbox, snapshot id, fingerprint)."""
    sb = Sandbox.run(container_image=BUSYBOX, tags=[session_tag, "snapshots"],
                     file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT))
    snap_id = None
    try:
        sb.wait(timeout=START_TIMEOUT)
        _sh(sb, SEED, MOUNT, "seed-" + uuid.uuid4().hex)
        fp = _sh(sb, FINGERPRINT, MOUNT)
        assert "./sub/random.bin F 644 1048576" in fp, fp
        snap_id = sb.snapshot().result(timeout=SNAP_TIMEOUT)
        assert snap_id
        yield sb, snap_id, fp
    finally:
        try:
            sb.stop().result(timeout=60)
        except Exception:  # noqa: BLE001
            pass
        if snap_id:
            try:
                Sandbox.delete_snapshot(snap_id, missing_ok=True).result(timeout=60)
            except Exception:  # noqa: BLE001
                pass


@pytest.fixture
def snapshots_made():
    """Snapshot IDs a test adds here are deleted (missing_ok) when it ends."""
    ids: list[tuple[str, object]] = []
    yield ids
    for sid, auth in ids:
        try:
            Sandbox.delete_snapshot(sid, missing_ok=True, auth=auth).result(timeout=60)
        except Exception:  # noqa: BLE001
            pass


@pytest.mark.timeout(300)
def test_snapshot_restores_into_new_sandboxes(source, new_sandbox):
    src, snap_id, fp = source
    # The workload kept running through the snapshot.
    assert src.get_status() == SandboxStatus.RUNNING
    assert _sh(src, "echo alive") == "alive\n"
    # Writes after the snapshot are not in it.
    _sh(src, f"echo later > {MOUNT}/after.txt")

    forks = [_start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT, file_system_snapshot_id=snap_id))
             for _ in range(2)]
    for fork in forks:
        assert _sh(fork, FINGERPRINT, MOUNT) == fp
    # Each fork has its own copy: a write in one is not seen by the other or the source.
    _sh(forks[0], f"echo changed > {MOUNT}/token.txt && rm {MOUNT}/sub/random.bin")
    assert _sh(forks[1], FINGERPRINT, MOUNT) == fp
    assert "./after.txt" in _sh(src, FINGERPRINT, MOUNT)
    # The restored volume is writable and usable like a fresh one.
    _sh(forks[1], f"head -c 65536 /dev/zero > {MOUNT}/new.bin && sync")


@pytest.mark.timeout(120)
def test_get_and_list_snapshot_fields(source):
    src, snap_id, _ = source
    snap = Sandbox.get_snapshot(snap_id).result(timeout=30)
    assert snap.file_system_snapshot_id == snap_id
    assert snap.status == FileSystemSnapshotStatus.READY, snap
    assert snap.trigger == FileSystemSnapshotTrigger.MANUAL
    assert snap.source_sandbox_id == src.sandbox_id
    assert snap.source_volume_name == "workspace"
    # 1 MiB of random bytes does not compress.
    assert snap.size_bytes > 1 << 20, snap
    assert snap.created_at is not None and snap.completed_at is not None
    assert snap.completed_at >= snap.created_at

    listed = {s.file_system_snapshot_id: s for s in Sandbox.list_snapshots().result(timeout=60)}
    assert snap_id in listed
    assert listed[snap_id].size_bytes == snap.size_bytes
    assert listed[snap_id].source_volume_name == "workspace"
    mine = Sandbox.list_snapshots(source_sandbox_id=src.sandbox_id).result(timeout=60)
    assert [s.file_system_snapshot_id for s in mine] == [snap_id]
    ready = Sandbox.list_snapshots(status=FileSystemSnapshotStatus.READY).result(timeout=60)
    assert snap_id in {s.file_system_snapshot_id for s in ready}
    assert Sandbox.list_snapshots(source_sandbox_id="sbx-no-such-sandbox").result(timeout=60) == []


@pytest.mark.timeout(300)
def test_delete_snapshot(new_sandbox):
    sb = _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT))
    _sh(sb, f"echo doomed > {MOUNT}/f")
    snap_id = sb.snapshot().result(timeout=SNAP_TIMEOUT)

    Sandbox.delete_snapshot(snap_id).result(timeout=60)
    _wait_gone(snap_id)
    with pytest.raises(SnapshotNotFoundError):
        Sandbox.get_snapshot(snap_id).result(timeout=30)
    assert snap_id not in {s.file_system_snapshot_id for s in Sandbox.list_snapshots().result(timeout=60)}
    with pytest.raises(SnapshotNotFoundError):
        Sandbox.delete_snapshot(snap_id).result(timeout=60)
    Sandbox.delete_snapshot(snap_id, missing_ok=True).result(timeout=60)
    # A deleted snapshot cannot be restored.
    with pytest.raises(SnapshotNotFoundError):
        _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT, file_system_snapshot_id=snap_id))


@pytest.mark.timeout(300)
def test_snapshot_on_stop(new_sandbox, snapshots_made):
    sb = _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT))
    _sh(sb, f"echo farewell > {MOUNT}/bye.txt")
    sb.stop(snapshot_on_stop=True).result(timeout=SNAP_TIMEOUT + 60)
    snap_id = sb.file_system_snapshot_id
    assert snap_id, "stop(snapshot_on_stop=True) returned no snapshot ID"
    snapshots_made.append((snap_id, None))
    assert sb.get_status() in (SandboxStatus.TERMINATED, SandboxStatus.COMPLETED)

    # stop() waited for it: READY, taken on delete, of this sandbox's volume.
    snap = Sandbox.get_snapshot(snap_id).result(timeout=30)
    assert snap.status == FileSystemSnapshotStatus.READY, snap
    assert snap.trigger == FileSystemSnapshotTrigger.ON_DELETE
    assert snap.source_sandbox_id == sb.sandbox_id
    assert snap.source_volume_name == "workspace"
    assert snap.size_bytes > 0

    fork = _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT, file_system_snapshot_id=snap_id))
    assert _sh(fork, f"cat {MOUNT}/bye.txt") == "farewell\n"


@pytest.mark.timeout(300)
def test_named_volume_with_explicit_mounts(new_sandbox, snapshots_made):
    # A volume named "data" (not the default "workspace"), mounted by the container itself.
    sb = _start(new_sandbox, volumes=[ScratchVolumeOptions(name="data", size="64Mi")],
                containers=[Container(image=BUSYBOX, command="/bin/sh", args=KEEPALIVE,
                                      volume_mounts=[VolumeMount(volume="data", mount_path="/data")])])
    _sh(sb, "echo named > /data/n.txt && mkdir -p /data/d && echo deep > /data/d/x")
    snap_id = sb.snapshot().result(timeout=SNAP_TIMEOUT)
    snapshots_made.append((snap_id, None))
    snap = Sandbox.get_snapshot(snap_id).result(timeout=30)
    assert snap.source_volume_name == "data"
    assert snap.status == FileSystemSnapshotStatus.READY

    # Restored into a volume of another name, at another path: names need not match.
    fork = _start(new_sandbox, volumes=[ScratchVolumeOptions(name="copy", mount_path="/restored", restore_from_snapshot_id=snap_id)])
    assert _sh(fork, "cat /restored/n.txt /restored/d/x") == "named\ndeep\n"


@pytest.mark.timeout(300)
def test_snapshot_on_stop_takes_every_scratch_volume(new_sandbox, snapshots_made):
    sb = _start(new_sandbox, volumes=[ScratchVolumeOptions(name="alpha", mount_path="/a"),
                                      ScratchVolumeOptions(name="beta", mount_path="/b")])
    _sh(sb, "echo A > /a/f && echo B > /b/f")
    sb.stop(snapshot_on_stop=True).result(timeout=SNAP_TIMEOUT + 60)
    snaps = Sandbox.list_snapshots(source_sandbox_id=sb.sandbox_id).result(timeout=60)
    for s in snaps:
        snapshots_made.append((s.file_system_snapshot_id, None))
    assert sorted(s.source_volume_name for s in snaps) == ["alpha", "beta"], snaps
    assert {s.trigger for s in snaps} == {FileSystemSnapshotTrigger.ON_DELETE}
    assert {s.status for s in snaps} == {FileSystemSnapshotStatus.READY}
    assert sb.file_system_snapshot_id in {s.file_system_snapshot_id for s in snaps}
    beta = next(s for s in snaps if s.source_volume_name == "beta")
    fork = _start(new_sandbox, volumes=[ScratchVolumeOptions(name="beta", mount_path="/b", restore_from_snapshot_id=beta.file_system_snapshot_id)])
    assert _sh(fork, "cat /b/f") == "B\n"


@pytest.mark.timeout(300)
def test_other_organization_snapshot_is_not_found(source, other_org_key, new_sandbox):
    _, snap_id, _ = source
    other = _auth(other_org_key)
    with pytest.raises(SnapshotNotFoundError):
        Sandbox.get_snapshot(snap_id, auth=other).result(timeout=30)
    assert snap_id not in {s.file_system_snapshot_id for s in Sandbox.list_snapshots(auth=other).result(timeout=60)}
    with pytest.raises(SnapshotNotFoundError):
        Sandbox.delete_snapshot(snap_id, auth=other).result(timeout=60)
    # missing_ok hides that it exists, and deletes nothing.
    Sandbox.delete_snapshot(snap_id, missing_ok=True, auth=other).result(timeout=60)
    with pytest.raises(SnapshotNotFoundError):
        _start(new_sandbox, auth=other,
               file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT, file_system_snapshot_id=snap_id))
    assert Sandbox.get_snapshot(snap_id).result(timeout=30).status == FileSystemSnapshotStatus.READY


@pytest.mark.timeout(120)
def test_restore_of_unknown_snapshot_is_refused(new_sandbox):
    with pytest.raises(SnapshotNotFoundError):
        _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(
            mount_path=MOUNT, file_system_snapshot_id="fss-" + uuid.uuid4().hex))


@pytest.mark.timeout(120)
def test_snapshot_of_unknown_volume_is_refused(source, sandboxd):
    """The client only ever names the sandbox's own volumes, so this is the raw RPC."""
    src, _, _ = source
    target = urlparse(sandboxd.base_url).netloc
    md = (("authorization", f"Bearer {sandboxd.admin_key}"),)
    with grpc.insecure_channel(target) as ch:
        stub = sandbox_pb2_grpc.SandboxServiceStub(ch)
        with pytest.raises(grpc.RpcError) as exc:
            stub.CreateFileSystemSnapshot(sandbox_pb2.CreateFileSystemSnapshotRequest(
                sandbox_id=src.sandbox_id, scratch_volume_name="no-such-volume"), metadata=md, timeout=30)
    e = exc.value
    assert e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), e
    parsed = parse_error_info(e)
    assert parsed is not None and parsed.domain == "cwsandbox.com" and parsed.reason.startswith("CWSANDBOX_"), parsed
    assert "no-such-volume" in (e.details() or ""), e.details()
    # Nothing was recorded for it.
    assert [s.source_volume_name for s in Sandbox.list_snapshots(source_sandbox_id=src.sandbox_id).result(timeout=60)] == ["workspace"]


@pytest.mark.timeout(180)
def test_snapshot_on_stop_with_missing_ok_is_a_conflict(new_sandbox):
    sb = _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT))
    with pytest.raises(SnapshotOnStopConflictError):
        sb.stop(snapshot_on_stop=True, missing_ok=True).result(timeout=60)
    # The refused stop stopped nothing and took no snapshot.
    assert Sandbox.from_id(sb.sandbox_id).result(timeout=30).get_status() == SandboxStatus.RUNNING
    assert Sandbox.list_snapshots(source_sandbox_id=sb.sandbox_id).result(timeout=60) == []


@pytest.mark.timeout(300)
def test_restore_into_too_small_volume_is_refused(new_sandbox, snapshots_made):
    sb = _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT))
    _sh(sb, f"head -c 4194304 /dev/urandom > {MOUNT}/big.bin")
    snap_id = sb.snapshot().result(timeout=SNAP_TIMEOUT)
    snapshots_made.append((snap_id, None))
    with pytest.raises(SnapshotSizeExceededError) as exc:
        _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(
            mount_path=MOUNT, size="1Mi", file_system_snapshot_id=snap_id))
    assert isinstance(exc.value, SandboxSnapshotError)
    # A volume big enough takes it.
    fork = _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(
        mount_path=MOUNT, size="16Mi", file_system_snapshot_id=snap_id))
    assert _sh(fork, f"stat -c %s {MOUNT}/big.bin") == "4194304\n"


# ---------------------------------------------------------------------------------------------
# The official CLI.


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "cwsandbox", *args], capture_output=True, text=True, timeout=SNAP_TIMEOUT + 60)
    if check:
        assert res.returncode == 0, f"cwsandbox {' '.join(args)}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


@pytest.mark.timeout(400)
def test_cli_snapshots(new_sandbox, snapshots_made):
    sb = _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT))
    _sh(sb, f"echo from-cli > {MOUNT}/c.txt")

    snap_id = json.loads(_cli("snapshots", "create", sb.sandbox_id, "-o", "json").stdout)["file_system_snapshot_id"]
    snapshots_made.append((snap_id, None))
    got = json.loads(_cli("snapshots", "get", snap_id, "-o", "json").stdout)
    assert got["status"] == "ready" and got["trigger"] == "manual", got
    assert got["source_sandbox_id"] == sb.sandbox_id and got["source_volume_name"] == "workspace" and got["size_bytes"] > 0
    listed = json.loads(_cli("snapshots", "list", "--source-sandbox-id", sb.sandbox_id, "-o", "json").stdout)
    assert [s["file_system_snapshot_id"] for s in listed] == [snap_id]
    assert snap_id in _cli("snapshots", "list").stdout

    assert _cli("snapshots", "delete", snap_id).stdout.strip() == f"Deleted {snap_id}."
    _wait_gone(snap_id)
    assert _cli("snapshots", "get", snap_id, check=False).returncode != 0
    assert _cli("snapshots", "delete", snap_id, check=False).returncode != 0
    _cli("snapshots", "delete", snap_id, "--missing-ok")

    out = _cli("stop", sb.sandbox_id, "--snapshot-on-stop").stdout.strip()
    prefix = f"Stopped sandbox {sb.sandbox_id}. Snapshot "
    assert out.startswith(prefix) and out.endswith("."), out
    stop_id = out[len(prefix):-1]
    snapshots_made.append((stop_id, None))
    got = json.loads(_cli("snapshots", "get", stop_id, "-o", "json").stdout)
    assert got["status"] == "ready" and got["trigger"] == "on_delete" and got["source_sandbox_id"] == sb.sandbox_id, got

    fork = _start(new_sandbox, file_system_snapshot=FileSystemSnapshotOptions(mount_path=MOUNT, file_system_snapshot_id=stop_id))
    assert _sh(fork, f"cat {MOUNT}/c.txt") == "from-cli\n"
