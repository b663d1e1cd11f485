"""Secret stores through the official ``cwsandbox`` client (issue 23 point 2, docs/secrets.md).

The organization's admin creates a built-in secret store and a secret over REST
(SettingsService.CreateSecretStore, sandboxd.settings.v1.SecretService.PutSecret); the
client's ``Sandbox.run(..., secrets=[Secret(...)])`` gets it as an environment variable, and
GetSandbox shows the reference only. A store the organization does not have is refused with
FAILED_PRECONDITION CWSANDBOX_SECRET_STORE_NOT_PROVISIONED, which the client puts on its
exception.
"""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox import Secret  # noqa: E402
from cwsandbox.exceptions import CWSandboxError  # noqa: E402

pytestmark = [pytest.mark.usefixtures("client"), pytest.mark.timeout(180)]

VALUE = "conformance-secret-" + uuid.uuid4().hex


def _rest(sandboxd, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(sandboxd.base_url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {sandboxd.admin_key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read() or b"{}")


@pytest.fixture
def store(sandboxd):
    name = f"conf-{uuid.uuid4().hex[:10]}"
    made = _rest(sandboxd, "POST", "/v1/settings/secretStores", {"name": name})
    assert made["name"] == name
    put = _rest(sandboxd, "POST", f"/v1/settings/secretStores/{name}/secrets",
                {"path": "db/main", "field": "password", "value": VALUE})
    assert put["path"] == "db/main" and "value" not in put
    yield name
    _rest(sandboxd, "DELETE", f"/v1/settings/secretStores/{name}")


def test_secret_becomes_env_var(sandboxd, store, new_sandbox):
    sb = new_sandbox("sleep", "600", container_image="busybox", tags=["secrets"],
                     secrets=[Secret(store=store, name="db/main", field="password", env_var="DB_PASSWORD")])
    sb.wait()
    out = sb.exec(["sh", "-c", "echo $DB_PASSWORD"]).result()
    assert out.stdout == VALUE + "\n"
    # The REST view of the store's secrets and of the sandbox: references, never the value.
    listed = _rest(sandboxd, "GET", f"/v1/settings/secretStores/{store}/secrets")
    assert [s["path"] for s in listed["secrets"]] == ["db/main"]
    assert VALUE not in json.dumps(listed)
    raw = _rest(sandboxd, "GET", f"/v1/sandboxes/{sb.sandbox_id}")
    assert VALUE not in json.dumps(raw)
    assert "DB_PASSWORD" in json.dumps(raw)


def test_unknown_store_refused_with_reason(new_sandbox):
    with pytest.raises(CWSandboxError) as exc:
        sb = new_sandbox("sleep", "600", container_image="busybox", tags=["secrets"],
                         secrets=[Secret(store="no-such-store", name="db/main", field="password", env_var="X")])
        sb.wait()
    assert exc.value.reason == "CWSANDBOX_SECRET_STORE_NOT_PROVISIONED", f"{type(exc.value).__name__}: {exc.value}"
