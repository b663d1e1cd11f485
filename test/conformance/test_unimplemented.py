"""RPCs sandboxd does not build yet, through the official ``cwsandbox`` client's stubs (issue 16 §5).

Every RPC of the client's services answers with a gRPC status: those not built yet (the
object-storage WIF config and secret stores of SettingsService; volumes are test_volumes.py's,
file-system snapshots test_snapshots.py's, templates test_templates.py's) are UNIMPLEMENTED
with the AIP-193 reason CWSANDBOX_NOT_IMPLEMENTED, which the client parses from the trailers
(``parse_error_info``), instead of the raw HTTP 404 an unknown service got. The same for every
protocol and REST is cmd/sandboxd's TestNotBuiltRPCsAnswerUnimplemented.
"""

from __future__ import annotations

import grpc
import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox._error_info import parse_error_info  # noqa: E402
from cwsandbox._proto import settings_pb2, settings_pb2_grpc  # noqa: E402

pytestmark = pytest.mark.usefixtures("client")

NOT_IMPLEMENTED = "CWSANDBOX_NOT_IMPLEMENTED"


@pytest.mark.timeout(60)
def test_not_built_rpc_says_so(sandboxd):
    with grpc.insecure_channel(sandboxd.base_url.removeprefix("http://")) as ch:
        stub = settings_pb2_grpc.SettingsServiceStub(ch)
        with pytest.raises(grpc.RpcError) as exc:
            stub.GetObjectStorageWifConfig(settings_pb2.GetObjectStorageWifConfigRequest(),
                                           metadata=(("authorization", f"Bearer {sandboxd.admin_key}"),), timeout=30)
    err = exc.value
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED, err
    parsed = parse_error_info(err)
    assert parsed is not None and parsed.reason == NOT_IMPLEMENTED, err
