"""Per-organization quotas (sandboxd.quota.v1), as the official client sees them: a create past
the organization's quota is RESOURCE_EXHAUSTED, which the client raises as
SandboxResourceExhaustedError with reason CWSANDBOX_QUOTA_EXCEEDED and ErrorInfo metadata naming
the quota, its limit and the usage; deleting a sandbox frees its slot."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from cwsandbox import Sandbox
from cwsandbox.exceptions import SandboxFailedError, SandboxResourceExhaustedError


def _call(server, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        server.base_url + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {server.admin_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read() or b"{}")


@pytest.fixture
def set_quota(client):
    """set_quota(extra): the admin organization's quota set to the sandboxes it runs now plus
    EXTRA; returns (org, limit). Reset to the defaults after the test."""
    org = None

    def set_(extra: int) -> tuple[str, int]:
        nonlocal org
        usage = _call(client, "GET", "/v1/quotaUsage")
        org = usage["orgId"]
        limit = int(usage.get("sandboxes", 0)) + extra
        _call(client, "PUT", f"/v1/quotas/{org}", {"limits": {"maxSandboxes": str(limit)}})
        return org, limit

    yield set_
    if org is not None:
        _call(client, "PUT", f"/v1/quotas/{org}", {"limits": {}})


def _refused(err: SandboxResourceExhaustedError, limit: int) -> None:
    assert err.reason == "CWSANDBOX_QUOTA_EXCEEDED", err
    assert err.metadata.get("quota") == "sandboxes", err.metadata
    assert err.metadata.get("limit") == str(limit), err.metadata
    assert err.metadata.get("current") == str(limit), err.metadata
    assert err.metadata.get("requested") == "1", err.metadata


def test_quota_full_is_resource_exhausted(set_quota, new_sandbox):
    """No room at all: the create is refused before any runner is asked (no image needed)."""
    _, limit = set_quota(0)
    with pytest.raises(SandboxResourceExhaustedError) as caught:
        sb = new_sandbox(container_image="busybox")
        sb.wait(timeout=90)
    _refused(caught.value, limit)


def test_quota_refuses_then_frees_on_delete(client, set_quota, new_sandbox):
    """Quota one more than in use: one runs, the next is refused, a delete frees the slot."""
    _, limit = set_quota(1)
    first = new_sandbox(container_image="busybox")
    try:
        first.wait(timeout=90)
    except SandboxFailedError as e:
        if "ImagePullFailed" in str(e):
            pytest.skip(f"the test images are not available here (make images): {e}")
        raise

    with pytest.raises(SandboxResourceExhaustedError) as caught:
        second = new_sandbox(container_image="busybox")
        second.wait(timeout=90)
    _refused(caught.value, limit)

    Sandbox.delete(first.sandbox_id).result(timeout=60)
    # A slot frees once the deleted sandbox has ended and the index records it (docs/admin.md,
    # "Quotas"): a delete returns while the sandbox is still terminating.
    deadline = time.monotonic() + 60
    while int(_call(client, "GET", "/v1/quotaUsage").get("sandboxes", 0)) >= limit:
        assert time.monotonic() < deadline, "the deleted sandbox still holds its slot after 60 s"
        time.sleep(0.2)
    third = new_sandbox(container_image="busybox")
    third.wait(timeout=90)
    assert third.sandbox_id


def test_quota_usage_is_readable(client, set_quota):
    org, limit = set_quota(1)
    usage = _call(client, "GET", "/v1/quotaUsage")
    assert usage["orgId"] == org
    assert int(usage["effective"]["maxSandboxes"]) == limit
    assert int(usage.get("sandboxes", 0)) == limit - 1
