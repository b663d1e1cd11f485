"""Registered volumes (issue 23) through the official ``cwsandbox`` client.

A CLUSTER_LOCAL volume of the local runner (``PvcVolumeSource``: the runner's ID, namespace
``default``, claim_name naming a runner-managed ext4 image): create (admin key) → VALIDATING,
``wait_until_ready`` → READY with a capacity; list / get / update(description) / validate; a
file written by one sandbox is read by the next one mounting it (``RegisteredVolumeOptions``),
read-only and sub_path mounts work, deleting it while mounted is refused
(CWSANDBOX_VOLUME_IN_USE) and afterwards it is gone; another organization does not see it.
"""

from __future__ import annotations

import uuid

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox import PvcVolumeSource, RegisteredVolumeOptions, Volume, VolumeState, list_runners  # noqa: E402
from cwsandbox.exceptions import CWSandboxError  # noqa: E402

from devserver import auth as _auth  # noqa: E402

pytestmark = [pytest.mark.usefixtures("client"), pytest.mark.timeout(240)]

BUSYBOX = "busybox"
START_TIMEOUT = 60


def test_volume_lifecycle(sandboxd, new_sandbox, other_org_key):
    admin = _auth(sandboxd.admin_key)
    runner_id = list_runners()[0].runner_id
    vid = f"conf-{uuid.uuid4().hex[:10]}"
    claim = f"claim-{uuid.uuid4().hex[:10]}"
    vol = Volume.create(vid, pvc=PvcVolumeSource(runner_id=runner_id, namespace="default", claim_name=claim),
                        description="conformance", auth=admin).result(timeout=30)
    try:
        assert vol.state in (VolumeState.VALIDATING, VolumeState.READY), vol
        vol.wait_until_ready(timeout=60).result(timeout=90)
        assert vol.state == VolumeState.READY and vol.capacity == "10Gi", vol
        assert vol.locality.value == "cluster_local"

        assert vid in [v.volume_id for v in Volume.list().result(timeout=30)]
        got = Volume.get(vid).result(timeout=30)
        assert got.pvc.claim_name == claim and got.description == "conformance"
        vol.update(description="renamed", auth=admin).result(timeout=30)
        assert Volume.get(vid).result(timeout=30).description == "renamed"
        vol.validate(auth=admin).result(timeout=60)
        assert vol.state == VolumeState.READY and vol.last_validated_at is not None

        # Another organization sees nothing.
        assert vid not in [v.volume_id for v in Volume.list(auth=_auth(other_org_key)).result(timeout=30)]
        with pytest.raises(CWSandboxError):
            Volume.get(vid, auth=_auth(other_org_key)).result(timeout=30)

        def mount(**kw):
            return [RegisteredVolumeOptions(name="v", volume_id=vid, mount_path="/data", **kw)]

        writer = new_sandbox(container_image=BUSYBOX, volumes=mount())
        writer.wait(timeout=START_TIMEOUT)
        res = writer.exec(["sh", "-c", "echo persisted > /data/f && mkdir -p /data/d && echo inner > /data/d/g && sync"]).result(timeout=30)
        assert res.returncode == 0, res
        writer.stop().result(timeout=40)

        reader = new_sandbox(container_image=BUSYBOX, volumes=mount(read_only=True))
        reader.wait(timeout=START_TIMEOUT)
        assert reader.exec(["cat", "/data/f"]).result(timeout=30).stdout == "persisted\n"
        assert reader.exec(["sh", "-c", "echo x > /data/nope"]).result(timeout=30).returncode != 0

        sub = new_sandbox(container_image=BUSYBOX, volumes=mount(sub_path="d"))
        sub.wait(timeout=START_TIMEOUT)
        assert sub.exec(["cat", "/data/g"]).result(timeout=30).stdout == "inner\n"

        assert Volume.get(vid).result(timeout=30).attached_sandbox_count == 2
        with pytest.raises(CWSandboxError) as e:
            Volume.get(vid).result(timeout=30).delete(auth=admin).result(timeout=30)
        assert "mounted" in str(e.value) or "IN_USE" in str(e.value), e.value
        reader.stop().result(timeout=40)
        sub.stop().result(timeout=40)
    finally:
        Volume.get(vid, auth=admin).result(timeout=30).delete(force=True, allow_missing=True, auth=admin).result(timeout=60)
    with pytest.raises(CWSandboxError):
        Volume.get(vid).result(timeout=30)


def _rest(server, method: str, path: str, body: dict | None = None) -> dict:
    import json
    import urllib.request

    req = urllib.request.Request(
        server.base_url + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {server.admin_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read() or b"{}")


def test_volume_bytes_quota(sandboxd):
    """max_volume_bytes (sandboxd.quota.v1, set over REST by the platform's admin): the
    official client's Volume.create of a volume (10Gi, its default size) past it is refused
    RESOURCE_EXHAUSTED CWSANDBOX_QUOTA_EXCEEDED naming volume_bytes; usage counts the
    organization's volumes and their bytes."""
    admin = _auth(sandboxd.admin_key)
    runner_id = list_runners()[0].runner_id
    usage = _rest(sandboxd, "GET", "/v1/quotaUsage")
    org, used = usage["orgId"], int(usage.get("volumeBytes", 0))
    limit = used + (5 << 30)
    _rest(sandboxd, "PUT", f"/v1/quotas/{org}", {"limits": {"maxVolumeBytes": str(limit)}})
    try:
        vid = f"conf-q-{uuid.uuid4().hex[:8]}"
        with pytest.raises(CWSandboxError) as caught:
            # The client retries RESOURCE_EXHAUSTED on volume RPCs for its budget (30 s),
            # then raises it.
            Volume.create(vid, pvc=PvcVolumeSource(runner_id=runner_id, namespace="default", claim_name=vid),
                          auth=admin).result(timeout=120)
        err = caught.value
        text = str(err)
        assert "CWSANDBOX_QUOTA_EXCEEDED" in text or getattr(err, "reason", None) == "CWSANDBOX_QUOTA_EXCEEDED", text
        meta = getattr(err, "metadata", None) or {}
        if meta:
            assert meta.get("quota") == "volume_bytes" and meta.get("limit") == str(limit), meta
        assert vid not in [v.volume_id for v in Volume.list(auth=admin).result(timeout=30)]
        after = _rest(sandboxd, "GET", "/v1/quotaUsage")
        assert int(after.get("volumeBytes", 0)) == used, after
        assert after["effective"]["maxVolumeBytes"] == str(limit), after
    finally:
        _rest(sandboxd, "PUT", f"/v1/quotas/{org}", {"limits": {}})
