"""Per-organization quotas (sandboxd.quota.v1), as the official client sees them: a create past
the organization's quota is RESOURCE_EXHAUSTED, which the client raises as
SandboxResourceExhaustedError with reason CWSANDBOX_QUOTA_EXCEEDED and ErrorInfo metadata naming
the quota, its limit and the usage; deleting a sandbox frees its slot."""

from __future__ import annotations

import json
import urllib.request

import pytest

from cwsandbox import Sandbox
from cwsandbox.exceptions import SandboxResourceExhaustedError


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
def quota_of_one_more(client):
    """The admin organization's quota set to one sandbox more than it runs now; reset after."""
    usage = _call(client, "GET", "/v1/quotaUsage")
    org = usage["orgId"]
    limit = int(usage.get("sandboxes", 0)) + 1
    _call(client, "PUT", f"/v1/quotas/{org}", {"limits": {"maxSandboxes": str(limit)}})
    yield org, limit
    _call(client, "PUT", f"/v1/quotas/{org}", {"limits": {}})


def test_quota_refuses_then_frees_on_delete(quota_of_one_more, new_sandbox):
    org, limit = quota_of_one_more
    first = new_sandbox(container_image="busybox")
    first.wait(timeout=90)

    with pytest.raises(SandboxResourceExhaustedError) as caught:
        second = new_sandbox(container_image="busybox")
        second.wait(timeout=90)
    err = caught.value
    assert err.reason == "CWSANDBOX_QUOTA_EXCEEDED", err
    assert err.metadata.get("quota") == "sandboxes", err.metadata
    assert err.metadata.get("limit") == str(limit), err.metadata
    assert err.metadata.get("current") == str(limit), err.metadata

    Sandbox.delete(first.sandbox_id).result(timeout=60)

    third = new_sandbox(container_image="busybox")
    third.wait(timeout=90)
    assert third.sandbox_id


def test_quota_usage_is_readable(client, quota_of_one_more):
    org, limit = quota_of_one_more
    usage = _call(client, "GET", "/v1/quotaUsage")
    assert usage["orgId"] == org
    assert int(usage["effective"]["maxSandboxes"]) == limit
    assert int(usage.get("sandboxes", 0)) == limit - 1
