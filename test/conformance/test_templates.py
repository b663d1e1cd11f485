"""Sandbox templates (issue 22) through the official ``cwsandbox`` client.

Templates are written through ``SandboxTemplateService`` with the client's own generated stubs
(``cwsandbox._proto.sandbox_template_pb2_grpc``, the same bearer key the client sends);
sandboxes start from them with ``Sandbox.run_from_template`` unchanged. Each merge rule of
CreateSandboxFromTemplate (replace-on-presence): a message (network) and a list (tags;
containers replace whole) replace when set, a zero scalar (max_lifetime_seconds 0) keeps the
template's, a list set but empty clears it (JSON, over REST: protobuf binary cannot say it).
The sandbox names its template (source_template_id / revision) and keeps its resolved spec
when the template changes; a runner policy judges the template's spec like a hand-written one
(the constraint named); another organization's template is NOT_FOUND.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import grpc
import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox import NetworkOptions, Sandbox  # noqa: E402
from cwsandbox._proto import sandbox_pb2, sandbox_pb2_grpc  # noqa: E402
from cwsandbox._proto import sandbox_template_pb2, sandbox_template_pb2_grpc  # noqa: E402
from cwsandbox.exceptions import CWSandboxError, CWSandboxValidationError  # noqa: E402
from google.protobuf import field_mask_pb2  # noqa: E402

from test_policy import _set_policy  # noqa: E402

pytestmark = [pytest.mark.usefixtures("client"), pytest.mark.timeout(180)]


def _md(key: str):
    return (("authorization", f"Bearer {key}"),)


@pytest.fixture
def stubs(sandboxd):
    with grpc.insecure_channel(sandboxd.base_url.removeprefix("http://")) as ch:
        yield sandbox_template_pb2_grpc.SandboxTemplateServiceStub(ch), sandbox_pb2_grpc.SandboxServiceStub(ch)


@pytest.fixture
def template(sandboxd, stubs, session_tag):
    """Factory: creates a template (admin key) and deletes it at test end."""
    tmpl_stub, _ = stubs
    made = []

    def create(spec: sandbox_pb2.PartialSandboxSpec, name: str | None = None):
        t = tmpl_stub.CreateSandboxTemplate(
            sandbox_template_pb2.CreateSandboxTemplateRequest(
                sandbox_template=sandbox_template_pb2.SandboxTemplate(
                    display_name=name or f"conformance-{uuid.uuid4().hex[:10]}", spec=spec)),
            metadata=_md(sandboxd.admin_key), timeout=30)
        made.append(t.sandbox_template_id)
        return t

    yield create
    for tid in made:
        try:
            tmpl_stub.DeleteSandboxTemplate(sandbox_template_pb2.DeleteSandboxTemplateRequest(sandbox_template_id=tid),
                                            metadata=_md(sandboxd.admin_key), timeout=30)
        except grpc.RpcError:
            pass


def _base_spec(session_tag: str, **kw) -> sandbox_pb2.PartialSandboxSpec:
    spec = sandbox_pb2.PartialSandboxSpec(
        containers=[sandbox_pb2.PartialContainer(name="main", image="busybox", command="sleep", args=["3600"],
                                                 environment_variables={"FROM_TEMPLATE": "yes"})],
        tags=[session_tag, "from-template"],
        max_lifetime_seconds=600,
        **kw,
    )
    return spec


def _get(sandboxd, stubs, sandbox_id: str) -> sandbox_pb2.Sandbox:
    _, sb_stub = stubs
    return sb_stub.GetSandbox(sandbox_pb2.GetSandboxRequest(sandbox_id=sandbox_id), metadata=_md(sandboxd.admin_key), timeout=30)


def _run(template_id: str, *args: str, **kw) -> Sandbox:
    sb = Sandbox.run_from_template(template_id, *args, **kw)
    sb.wait()
    return sb


def test_run_from_template_without_overrides(sandboxd, stubs, template, session_tag):
    t = template(_base_spec(session_tag))
    sb = _run(t.sandbox_template_id)
    try:
        assert sb.exec(["sh", "-c", "echo $FROM_TEMPLATE"]).result().stdout == "yes\n"
        got = _get(sandboxd, stubs, sb.sandbox_id)
        assert got.source_template_id == t.sandbox_template_id
        assert got.source_template_revision == 1
        assert list(got.spec.tags) == [session_tag, "from-template"]
        assert got.spec.max_lifetime_seconds == 600
        assert got.spec.containers[0].image == "busybox"
        # In the list too.
        _, sb_stub = stubs
        rows = sb_stub.ListSandboxes(sandbox_pb2.ListSandboxesRequest(tags=[session_tag, "from-template"]),
                                     metadata=_md(sandboxd.admin_key), timeout=30).sandboxes
        assert any(r.sandbox_id == sb.sandbox_id and r.source_template_id == t.sandbox_template_id for r in rows)
    finally:
        sb.stop().result()


def test_overrides_replace_on_presence(sandboxd, stubs, template, session_tag):
    t = template(_base_spec(session_tag, network=sandbox_pb2.NetworkOptions(deny_egress=True)))
    sb = _run(t.sandbox_template_id)
    try:
        got = _get(sandboxd, stubs, sb.sandbox_id)
        assert got.spec.network.deny_egress and not got.spec.network.deny_ingress, got.spec.network
    finally:
        sb.stop().result()
    # tags (a list) replace whole; network (a message) replaces; max_lifetime_seconds 0 is not
    # sent (zero): the template's 600 stays; the container list is the template's.
    sb = _run(t.sandbox_template_id, tags=[session_tag, "override"], network=NetworkOptions(deny_ingress=True))
    try:
        got = _get(sandboxd, stubs, sb.sandbox_id)
        assert list(got.spec.tags) == [session_tag, "override"]
        assert got.spec.network.deny_ingress and not got.spec.network.deny_egress, got.spec.network
        assert got.spec.max_lifetime_seconds == 600
        assert got.spec.containers[0].environment_variables["FROM_TEMPLATE"] == "yes"
    finally:
        sb.stop().result()
    # container_image replaces the whole container list: nothing of the template's container stays.
    sb = _run(t.sandbox_template_id, "3600", container_image="python:3.11", command="sleep", tags=[session_tag])
    try:
        got = _get(sandboxd, stubs, sb.sandbox_id)
        assert len(got.spec.containers) == 1
        assert got.spec.containers[0].image == "python:3.11"
        assert "FROM_TEMPLATE" not in got.spec.containers[0].environment_variables
        assert sb.exec(["sh", "-c", "echo ${FROM_TEMPLATE:-none}"]).result().stdout == "none\n"
    finally:
        sb.stop().result()


def test_list_set_but_empty_over_rest(sandboxd, stubs, template, session_tag):
    t = template(_base_spec(session_tag, annotations={"k": "v"}))

    def create(overrides: dict) -> dict:
        req = urllib.request.Request(
            sandboxd.base_url + "/v1/sandboxes:createFromTemplate", method="POST",
            data=json.dumps({"templateId": t.sandbox_template_id, "overrides": overrides}).encode(),
            headers={"Authorization": f"Bearer {sandboxd.admin_key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as res:
            return json.loads(res.read())

    cleared = create({"annotations": {}, "containers": [{"name": "main", "image": "busybox", "command": "sleep",
                                                         "args": ["3600"]}]})
    kept = create({"maxLifetimeSeconds": 0})
    try:
        assert not cleared["spec"].get("annotations"), cleared["spec"]
        assert cleared["spec"]["tags"] == [session_tag, "from-template"]
        assert kept["spec"]["annotations"] == {"k": "v"}
        assert kept["spec"]["maxLifetimeSeconds"] == 600
        assert kept["sourceTemplateId"] == t.sandbox_template_id
    finally:
        for sid in (cleared["sandboxId"], kept["sandboxId"]):
            Sandbox.delete(sid, missing_ok=True).result(timeout=30)


def test_template_update_leaves_running_sandboxes(sandboxd, stubs, template, session_tag):
    tmpl_stub, _ = stubs
    t = template(_base_spec(session_tag))
    sb = _run(t.sandbox_template_id)
    try:
        up = tmpl_stub.UpdateSandboxTemplate(
            sandbox_template_pb2.UpdateSandboxTemplateRequest(
                sandbox_template_id=t.sandbox_template_id,
                sandbox_template=sandbox_template_pb2.SandboxTemplate(
                    revision=1, spec=sandbox_pb2.PartialSandboxSpec(max_lifetime_seconds=120)),
                update_mask=field_mask_pb2.FieldMask(paths=["spec.max_lifetime_seconds"])),
            metadata=_md(sandboxd.admin_key), timeout=30)
        assert up.revision == 2
        got = _get(sandboxd, stubs, sb.sandbox_id)
        assert got.spec.max_lifetime_seconds == 600
        assert got.source_template_revision == 1
        assert sb.exec(["echo", "alive"]).result().stdout == "alive\n"
        # A stale revision is refused.
        with pytest.raises(grpc.RpcError) as e:
            tmpl_stub.UpdateSandboxTemplate(
                sandbox_template_pb2.UpdateSandboxTemplateRequest(
                    sandbox_template_id=t.sandbox_template_id,
                    sandbox_template=sandbox_template_pb2.SandboxTemplate(revision=1, display_name="x"),
                    update_mask=field_mask_pb2.FieldMask(paths=["display_name"])),
                metadata=_md(sandboxd.admin_key), timeout=30)
        assert e.value.code() == grpc.StatusCode.ABORTED
    finally:
        sb.stop().result()
    sb2 = _run(t.sandbox_template_id)
    try:
        got = _get(sandboxd, stubs, sb2.sandbox_id)
        assert got.spec.max_lifetime_seconds == 120
        assert got.source_template_revision == 2
    finally:
        sb2.stop().result()


def test_policy_rejects_template_spec(sandboxd, template, session_tag):
    t = template(_base_spec(session_tag))
    _set_policy(sandboxd, {"constraints": {"lifetime": {"max_seconds": 300}}})
    try:
        with pytest.raises(CWSandboxValidationError) as caught:
            _run(t.sandbox_template_id)
        err = caught.value
        assert err.reason == "CWSANDBOX_PLACEMENT_REJECTED", err
        described = {v.field: v.description for v in err.field_violations}
        assert any("constraints.lifetime.max_seconds" in d for d in described.values()), described
    finally:
        _set_policy(sandboxd, {})


def test_other_org_template_not_found(sandboxd, stubs, template, session_tag, other_org_key):
    tmpl_stub, _ = stubs
    t = template(_base_spec(session_tag))
    for key in (t.sandbox_template_id, t.display_name):
        with pytest.raises(grpc.RpcError) as e:
            tmpl_stub.GetSandboxTemplate(sandbox_template_pb2.GetSandboxTemplateRequest(sandbox_template_id=key),
                                         metadata=_md(other_org_key), timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(CWSandboxError) as caught:
        from devserver import auth as _auth

        _run(t.sandbox_template_id, auth=_auth(other_org_key))
    assert caught.value.reason == "CWSANDBOX_TEMPLATE_NOT_FOUND", caught.value
