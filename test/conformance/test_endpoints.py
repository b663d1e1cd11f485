"""Public endpoints through the official client: what a create, Get and List echo of them
(``service_addresses``, ``service_endpoints``, the create-only ``endpoint_share_token``) and what
the runner's edge accepts on an HTTPS SHARE_TOKEN endpoint. The suite gives ``sandboxd dev`` an
edge on a free port (``client.edge``); requests reach it with the endpoint's host name as SNI
and Host, trusting the dev CA (``DATA_DIR/ca.pem``), so no DNS is involved."""

from __future__ import annotations

import http.client
import socket
import ssl
import time
import urllib.parse

import pytest

from cwsandbox import (
    Endpoint,
    EndpointAuth,
    EndpointKind,
    EndpointShareToken,
    Sandbox,
    SandboxStatus,
    Service,
    ServiceVisibility,
)

BUSYBOX = "busybox"
PYTHON = "python:3.11"
START_TIMEOUT = 90
SHARE_TOKEN_PARAM = "sandbox_share_token"  # the edge's query-parameter fallback (docs/endpoints.md)

pytestmark = pytest.mark.usefixtures("client")


def _https(port: int, auth: EndpointAuth, timeout: int | None = None, name: str = "") -> Service:
    return Service(
        port=port,
        name=name,
        visibility=ServiceVisibility.PUBLIC,
        endpoint=Endpoint(kind=EndpointKind.HTTPS, auth=auth, request_timeout_seconds=timeout),
    )


class _EdgeConnection(http.client.HTTPSConnection):
    """HTTPS to an endpoint host name, connected to the edge's address (no DNS needed)."""

    def __init__(self, host: str, port: int, edge: str, context: ssl.SSLContext):
        super().__init__(host, port, context=context, timeout=15)
        ehost, eport = edge.rsplit(":", 1)
        self._edge = (ehost, int(eport))

    def connect(self) -> None:
        sock = socket.create_connection(self._edge, timeout=self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _edge_get(client, url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """GET url through the suite's edge; returns (status, body)."""
    u = urllib.parse.urlsplit(url)
    ctx = ssl.create_default_context(cafile=str(client.data_dir / "ca.pem"))
    conn = _EdgeConnection(u.hostname, u.port or 443, client.edge, ctx)
    try:
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        conn.request("GET", target, headers=headers or {})
        res = conn.getresponse()
        return res.status, res.read().decode(errors="replace")
    finally:
        conn.close()


def _https_url(sb: Sandbox, port: int, timeout: float = START_TIMEOUT) -> str:
    """The HTTPS URL of sb's port once the API hands it out (the sandbox runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sb.get_status()
        for p, _, url in sb.service_urls:
            if p == port and url:
                return url
        time.sleep(0.5)
    raise AssertionError(f"sandbox {sb.sandbox_id}: no URL for port {port} in service_urls after {timeout}s")


def _until_served(client, url: str, headers: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """GET until the workload answers (the edge says 502 until it listens)."""
    deadline = time.monotonic() + timeout
    while True:
        code, body = _edge_get(client, url, headers)
        if code != 502 or time.monotonic() > deadline:
            return code, body
        time.sleep(0.5)


@pytest.mark.timeout(150)
def test_passthrough_address_from_create(new_sandbox, client, session_tag):
    """The create response is CREATING and names the passthrough address, so the client keeps
    it in service_addresses from create on; Get and List echo the same."""
    svc = Service(
        port=8443, name="tls", visibility=ServiceVisibility.PUBLIC, endpoint=Endpoint(kind=EndpointKind.TLS_PASSTHROUGH)
    )
    sb = new_sandbox("sleep", "600", container_image=BUSYBOX, services=[svc])
    assert sb.status == SandboxStatus.PENDING  # client-local until the first GetSandbox
    created = sb.service_addresses
    assert len(created) == 1, f"create left service_addresses {created} (the client keeps them only for CREATING/RUNNING)"
    host, port = created[0].address.rsplit(":", 1)
    assert (created[0].port, created[0].name) == (8443, "tls")
    assert host.startswith(f"8443-{sb.sandbox_id}.") and port == client.edge.rsplit(":", 1)[1], created
    assert sb.get_status() in (SandboxStatus.CREATING, SandboxStatus.RUNNING)
    sb.wait(timeout=START_TIMEOUT)
    assert Sandbox.from_id(sb.sandbox_id).result(timeout=20).service_addresses == created
    listed = [s for s in Sandbox.list(tags=[session_tag]).result(timeout=30) if s.sandbox_id == sb.sandbox_id]
    assert len(listed) == 1 and listed[0].service_addresses == created


@pytest.mark.timeout(150)
def test_https_service_endpoints(new_sandbox):
    """Every HTTPS endpoint echoes its auth and effective request timeout (15 s by default),
    which the client needs to list it in service_endpoints."""
    sb = new_sandbox(
        "sleep", "600", container_image=BUSYBOX,
        services=[_https(8080, EndpointAuth.OPEN, name="web"), _https(8081, EndpointAuth.SHARE_TOKEN, 60, name="api")],
    )
    want = {(8080, "web", EndpointAuth.OPEN, 15), (8081, "api", EndpointAuth.SHARE_TOKEN, 60)}

    def seen(s: Sandbox) -> set:
        return {(e.port, e.name, e.auth, e.request_timeout_seconds) for e in s.service_endpoints}

    assert seen(sb) == want, sb.service_endpoints
    assert all(e.kind == EndpointKind.HTTPS for e in sb.service_endpoints)
    sb.wait(timeout=START_TIMEOUT)
    again = Sandbox.from_id(sb.sandbox_id).result(timeout=20)
    assert seen(again) == want, again.service_endpoints
    assert all(e.url.startswith("https://") for e in again.service_endpoints), again.service_endpoints


@pytest.mark.timeout(240)
def test_https_share_token(new_sandbox, client, session_tag):
    """A SHARE_TOKEN endpoint: the create-only token opens it (header and query parameter),
    nothing else does (no token, another sandbox's token), and Get/List never carry it."""
    share = [_https(8000, EndpointAuth.SHARE_TOKEN, name="http")]
    sb = new_sandbox("python3", "-m", "http.server", "8000", container_image=PYTHON, services=share)
    other = new_sandbox("python3", "-m", "http.server", "8000", container_image=PYTHON, services=share)
    token, other_token = sb.endpoint_share_token, other.endpoint_share_token
    assert isinstance(token, EndpointShareToken) and isinstance(other_token, EndpointShareToken)
    assert str(token) == "<redacted>"
    assert token.get_secret_value() != other_token.get_secret_value()

    url = _https_url(sb, 8000)
    code, body = _until_served(client, url, token.as_headers())
    assert code == 200 and "Directory listing" in body, (code, body[:200])
    q = urllib.parse.urlencode({SHARE_TOKEN_PARAM: token.get_secret_value()})
    assert _edge_get(client, f"{url}/?{q}")[0] == 200
    assert _edge_get(client, url)[0] == 401
    assert _edge_get(client, url, other_token.as_headers())[0] == 401
    q_other = urllib.parse.urlencode({SHARE_TOKEN_PARAM: other_token.get_secret_value()})
    assert _edge_get(client, f"{url}/?{q_other}")[0] == 401
    # The other sandbox's endpoint takes its own token only.
    other_url = _https_url(other, 8000)
    assert _until_served(client, other_url, other_token.as_headers())[0] == 200
    assert _edge_get(client, other_url, token.as_headers())[0] == 401

    # Create-only: the live handles keep their tokens, nothing read later has one.
    assert sb.endpoint_share_token is token
    assert Sandbox.from_id(sb.sandbox_id).result(timeout=20).endpoint_share_token is None
    listed = Sandbox.list(tags=[session_tag]).result(timeout=30)
    assert {s.sandbox_id for s in listed} >= {sb.sandbox_id, other.sandbox_id}
    assert all(s.endpoint_share_token is None for s in listed)
