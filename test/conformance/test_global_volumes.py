"""GLOBAL registered volumes (issue 23) through the official ``cwsandbox`` client.

sandboxd reads ``PvcVolumeSource(runner_id="*", namespace="default", claim_name=…)`` as a GLOBAL
volume: it belongs to no runner, its content lives in the blob store (docs/volumes.md). Create →
READY with locality ``global``; a sandbox writes it; a second read-write mount while that one lives
is refused (FAILED_PRECONDITION CWSANDBOX_VOLUME_BUSY naming the holder) while a read-only one is
not; the writer is stopped (its copy uploaded as the next generation before it ends); the next
sandbox reads what it wrote.
"""

from __future__ import annotations

import uuid

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox import PvcVolumeSource, RegisteredVolumeOptions, Volume, VolumeState  # noqa: E402
from cwsandbox.exceptions import CWSandboxError  # noqa: E402

from devserver import auth as _auth  # noqa: E402

pytestmark = [pytest.mark.usefixtures("client"), pytest.mark.timeout(240)]

BUSYBOX = "busybox"
START_TIMEOUT = 60


def test_global_volume_moves_between_sandboxes(sandboxd, new_sandbox):
    admin = _auth(sandboxd.admin_key)
    vid = f"glob-{uuid.uuid4().hex[:10]}"
    claim = f"g-{uuid.uuid4().hex[:10]}"
    vol = Volume.create(vid, pvc=PvcVolumeSource(runner_id="*", namespace="default", claim_name=claim),
                        description="global", auth=admin).result(timeout=30)
    try:
        vol.wait_until_ready(timeout=60).result(timeout=90)
        assert vol.state == VolumeState.READY and vol.capacity == "10Gi", vol
        assert vol.locality.value == "global", vol
        assert Volume.get(vid).result(timeout=30).pvc.runner_id == "*"

        def mount(**kw):
            return [RegisteredVolumeOptions(name="v", volume_id=vid, mount_path="/data", **kw)]

        writer = new_sandbox(container_image=BUSYBOX, volumes=mount())
        writer.wait(timeout=START_TIMEOUT)
        res = writer.exec(["sh", "-c", "echo moved > /data/f && mkdir -p /data/d && echo inner > /data/d/g && sync"]).result(timeout=30)
        assert res.returncode == 0, res

        # One writer at a time: a second read-write mount is refused, naming the holder.
        with pytest.raises(CWSandboxError) as e:
            second = new_sandbox(container_image=BUSYBOX, volumes=mount())
            second.wait(timeout=START_TIMEOUT)
        assert "VOLUME_BUSY" in str(e.value) or writer.sandbox_id in str(e.value), e.value
        # A read-only mount is fine, and sees the last committed generation (still empty).
        early = new_sandbox(container_image=BUSYBOX, volumes=mount(read_only=True))
        early.wait(timeout=START_TIMEOUT)
        assert early.exec(["ls", "-A", "/data"]).result(timeout=30).stdout == ""
        early.stop().result(timeout=40)

        # The writer ends: its copy is committed; the next sandbox reads it.
        writer.stop().result(timeout=60)
        reader = new_sandbox(container_image=BUSYBOX, volumes=mount())
        reader.wait(timeout=START_TIMEOUT)
        assert reader.exec(["cat", "/data/f"]).result(timeout=30).stdout == "moved\n"
        assert reader.exec(["cat", "/data/d/g"]).result(timeout=30).stdout == "inner\n"
        reader.stop().result(timeout=60)
    finally:
        Volume.get(vid, auth=admin).result(timeout=30).delete(force=True, allow_missing=True, auth=admin).result(timeout=60)
