"""The direct mTLS data path (ConnectSandbox + SandboxDataPlaneService) with the official client.

In AUTO mode (the default) the client asks ConnectSandbox for a certificate on its first data
operation and then runs exec, files and logs against the runner's data plane. The server logs
"direct data-plane client connected" (at DEBUG: the suite runs it with -v) with the sandbox ID
when a client presents such a certificate, which is how these tests tell that the direct path,
not the gateway, was used.
"""

from __future__ import annotations

import re
import time

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
import grpc  # noqa: E402
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cwsandbox import Sandbox  # noqa: E402
from cwsandbox._proto import sandbox_pb2, sandbox_pb2_grpc  # noqa: E402

START_TIMEOUT = 60
pytestmark = pytest.mark.usefixtures("client")


def _connected_lines(server, sandbox_id: str) -> list[str]:
    text = server.log_path.read_text(errors="replace")
    return [ln for ln in text.splitlines() if "direct data-plane client connected" in ln and f"sandbox={sandbox_id}" in ln]


@pytest.fixture
def box(sandboxd, session_tag):
    made = []

    def run(*args, **kw) -> Sandbox:
        sb = Sandbox.run(*args, container_image="busybox", tags=[session_tag, "direct"], **kw)
        made.append(sb)
        sb.wait(timeout=START_TIMEOUT)
        return sb

    yield run
    for sb in made:
        try:
            Sandbox.delete(sb.sandbox_id, missing_ok=True).result(timeout=30)
        except Exception:  # noqa: BLE001
            pass


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["auto", "direct"])
def test_data_ops_go_direct(box, sandboxd, mode):
    sb = box("sh", "-c", "echo logline; exec sleep 3600", data_plane_mode=mode)
    res = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"]).result(timeout=30)
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n"), res
    sb.write_file("/tmp/direct.txt", b"hello direct").result(timeout=30)
    assert sb.read_file("/tmp/direct.txt").result(timeout=30) == b"hello direct"
    # Streaming exec with stdin.
    proc = sb.exec(["cat"], stdin=True)
    proc.stdin.write(b"piped\n").result(timeout=10)
    proc.stdin.close().result(timeout=10)
    res = proc.result(timeout=30)
    assert (res.returncode, res.stdout) == (0, "piped\n"), res
    logs = "".join(sb.stream_logs(timeout_seconds=20))
    assert "logline" in logs, logs
    lines = _connected_lines(sandboxd, sb.sandbox_id)
    assert lines, f"no direct data-plane connection for {sb.sandbox_id}:\n{sandboxd.log_tail(40)}"
    perms = " ".join(lines)
    # The client runs exec() as a streaming exec (it never asks for the unary EXEC permission);
    # each permission gets a certificate (and a connection) of its own.
    for perm in ("STREAM_EXEC", "WRITE_FILE", "READ_FILE", "STREAM_LOGS"):
        assert re.search(rf"SANDBOX_DATA_PERMISSION_{perm}\b", perms), (perm, lines)


@pytest.mark.timeout(120)
def test_gateway_mode_stays_on_gateway(box, sandboxd):
    sb = box(data_plane_mode="gateway")
    res = sb.exec(["echo", "via gateway"]).result(timeout=30)
    assert res.stdout == "via gateway\n"
    assert not _connected_lines(sandboxd, sb.sandbox_id)


def _csr(curve=ec.SECP256R1()) -> bytes:
    key = ec.generate_private_key(curve)
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.DER)


@pytest.mark.timeout(120)
def test_connect_sandbox_contract(box, sandboxd, other_org_key):
    sb = box()
    target = sandboxd.base_url.removeprefix("http://")
    with grpc.insecure_channel(target) as ch:
        stub = sandbox_pb2_grpc.SandboxServiceStub(ch)
        md = (("authorization", f"Bearer {sandboxd.admin_key}"),)
        exec_perm = [sandbox_pb2.SANDBOX_DATA_PERMISSION_EXEC]
        conn = stub.ConnectSandbox(sandbox_pb2.ConnectSandboxRequest(
            sandbox_id=sb.sandbox_id, csr_der=_csr(), requested_permissions=exec_perm), metadata=md, timeout=10)
        assert conn.endpoint_uri.startswith("https://127.0.0.1:")
        assert conn.transport == sandbox_pb2.SANDBOX_DATA_TRANSPORT_DIRECT_MTLS
        assert conn.protocol == sandbox_pb2.SANDBOX_DATA_PROTOCOL_CONNECT_H2_V1
        assert list(conn.granted_permissions) == exec_perm
        assert conn.client_certificate_chain_pem.startswith(b"-----BEGIN CERTIFICATE-----")
        assert conn.server_ca_bundle_pem.startswith(b"-----BEGIN CERTIFICATE-----")
        left = conn.expires_at.ToSeconds() - time.time()
        assert 10 * 60 < left <= 15 * 60 + 5, left
        cert = x509.load_pem_x509_certificate(conn.client_certificate_chain_pem)
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier)
        assert any(u.startswith("spiffe://sandboxd/sandbox/") and sb.sandbox_id in u for u in uris), uris

        def code(**kw):
            req = dict(sandbox_id=sb.sandbox_id, csr_der=_csr(), requested_permissions=exec_perm) | kw
            try:
                stub.ConnectSandbox(sandbox_pb2.ConnectSandboxRequest(**req), metadata=kw.pop("md", md), timeout=10)
            except grpc.RpcError as e:
                return e.code()
            return grpc.StatusCode.OK

        assert code(csr_der=_csr(ec.SECP384R1())) == grpc.StatusCode.INVALID_ARGUMENT
        assert code(csr_der=b"not a csr") == grpc.StatusCode.INVALID_ARGUMENT
        assert code(requested_permissions=[]) == grpc.StatusCode.INVALID_ARGUMENT
        try:
            stub.ConnectSandbox(sandbox_pb2.ConnectSandboxRequest(
                sandbox_id=sb.sandbox_id, csr_der=_csr(), requested_permissions=exec_perm),
                metadata=(("authorization", f"Bearer {other_org_key}"),), timeout=10)
            raise AssertionError("another organization got a certificate")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND
        sb.stop().result(timeout=40)
        assert code() == grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture
def blocked_data_plane(sandboxd):
    """Drops packets to the data plane's port (nftables, loopback), as a firewall would."""
    import shutil
    import subprocess

    if shutil.which("nft") is None:
        pytest.skip("nft not installed")
    port = sandboxd.data_plane.rsplit(":", 1)[1]
    table = f"sbxconf_{port}"
    script = f"""table inet {table} {{
  chain output {{ type filter hook output priority filter; policy accept; tcp dport {port} drop; }}
}}"""
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)
    yield
    subprocess.run(["nft", "delete", "table", "inet", table], check=False)


@pytest.mark.timeout(120)
def test_blocked_data_plane_falls_back_in_auto_and_fails_in_direct(sandboxd, box, blocked_data_plane):
    # AUTO: the data plane does not answer within the client's budget, so the gateway serves.
    sb = box("sleep", "600")
    res = sb.exec(["echo", "through the gateway"]).result(timeout=60)
    assert res.stdout == "through the gateway\n"
    assert not _connected_lines(sandboxd, sb.sandbox_id)
    # DIRECT: no fallback, a clear failure.
    direct = box("sleep", "600", data_plane_mode="direct")
    with pytest.raises(Exception) as caught:
        direct.exec(["true"]).result(timeout=60)
    # e.g. SandboxUnavailableError: Direct data-plane access is unavailable for sandbox …:
    # Timed out connecting to the direct data-plane endpoint 127.0.0.1:PORT
    assert "direct data-plane" in str(caught.value).lower(), caught.value
    assert not _connected_lines(sandboxd, direct.sandbox_id)
