"""A runner's policy, as the official client sees it: a sandbox the policy forbids is
refused at creation with field violations that name what to change."""

from __future__ import annotations

import json
import urllib.request

import pytest

from cwsandbox import Sandbox
from cwsandbox.exceptions import CWSandboxValidationError

STRICT = {"constraints": {"resources": {"max_cpu": "1", "max_memory": "512Mi"}, "lifetime": {"max_seconds": 900}}}


def _admin(server, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        server.base_url + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {server.admin_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read() or b"{}")


def _set_policy(server, policy: dict) -> None:
    runner = _admin(server, "GET", "/v1/sandbox/managedRunners/local")
    _admin(
        server,
        "PATCH",
        "/v1/sandbox/managedRunners/local?updateMask=policy",
        {"policy": policy, "etag": runner["etag"]},
    )


@pytest.fixture
def strict_policy(client):
    _set_policy(client, STRICT)
    yield
    _set_policy(client, {})


def test_policy_violations_name_what_to_change(strict_policy, session_tag):
    with pytest.raises(CWSandboxValidationError) as caught:
        sandbox = Sandbox.run(
            container_image="busybox",
            resources={"cpu": "4", "memory": "2Gi"},
            max_lifetime_seconds=3600,
            tags=[session_tag],
        )
        sandbox.wait()
    err = caught.value
    assert err.reason == "CWSANDBOX_PLACEMENT_REJECTED", err
    described = {v.field: v.description for v in err.field_violations}
    for field, constraint in [
        ("sandbox.spec.max_lifetime_seconds", "constraints.lifetime.max_seconds"),
        ("cpu", "constraints.resources.max_cpu"),
        ("memory", "constraints.resources.max_memory"),
    ]:
        matching = [d for f, d in described.items() if f.endswith(field) and constraint in d]
        assert matching, f"no violation of {constraint} on {field}: {described}"


def test_sandbox_within_policy_runs(strict_policy, session_tag):
    sandbox = Sandbox.run(container_image="busybox", resources={"cpu": "500m", "memory": "256Mi"}, tags=[session_tag])
    try:
        sandbox.wait()
        assert sandbox.exec(["echo", "ok"]).result().stdout == "ok\n"
    finally:
        sandbox.stop().result()
