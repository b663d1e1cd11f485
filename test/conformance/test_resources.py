"""Resources as the official client sees them: a sandbox that asks for none gets the runner's
default requests and limits (``sandboxd dev``: 100m/128Mi requested, 1 CPU/1Gi limits), one that
asks reports exactly what it sent, and one no runner could ever hold is refused at once with the
reason, not "try again later"."""

from __future__ import annotations

import functools
import time

import pytest

from cwsandbox import Sandbox
from cwsandbox.exceptions import SandboxError, SandboxResourceExhaustedError

START_TIMEOUT = 60

pytestmark = pytest.mark.usefixtures("client")


@pytest.fixture
def run(new_sandbox):
    """Sandbox.run on busybox with the session tag; deletes what it made at test end (conftest)."""
    return functools.partial(new_sandbox, container_image="busybox")


@pytest.mark.timeout(90)
def test_default_resources_are_reported(run):
    sb = run()
    sb.wait(timeout=START_TIMEOUT)
    assert sb.resource_requests == {"cpu": "100m", "memory": "128Mi"}, sb.resource_requests
    assert sb.resource_limits == {"cpu": "1", "memory": "1Gi"}, sb.resource_limits


@pytest.mark.timeout(90)
def test_requests_and_limits_are_reported_as_sent(run):
    sb = run(resources={"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}})
    sb.wait(timeout=START_TIMEOUT)
    assert sb.resource_requests == {"cpu": "500m", "memory": "512Mi"}, sb.resource_requests
    assert sb.resource_limits == {"cpu": "1", "memory": "1Gi"}, sb.resource_limits


@pytest.mark.timeout(60)
def test_request_no_runner_can_hold_fails_at_once(run):
    started = time.monotonic()
    with pytest.raises(SandboxError) as caught:
        # A capacity retry budget: a "no room now" answer would be retried for 30 s.
        sb = run(resources={"cpu": "64", "memory": "256Mi"}, create_retry_budget_seconds=30)
        sb.wait(timeout=START_TIMEOUT)
    took = time.monotonic() - started
    err = caught.value
    assert not isinstance(err, SandboxResourceExhaustedError), err
    assert err.reason == "CWSANDBOX_NO_SUITABLE_RUNNER", err
    assert "runner local has" in str(err), err
    assert took < 10, f"refused after {took:.1f}s"
