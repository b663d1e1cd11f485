"""Network options through the official client: the rules a sandbox asks for (or the platform
default, or none under ``deny_egress``) come back in ``effective_egress`` and, for host-name
rules, ``dns_egress_names``; malformed rules and rules outside the runner's policy are refused
with field violations. Whether traffic actually flows is the backend's test, not this suite's."""

from __future__ import annotations

import functools

import pytest

from cwsandbox import EgressRule, IngressRule, NetworkOptions, PortRange, Sandbox, Service, TenantScope
from cwsandbox.exceptions import CWSandboxValidationError
from test_policy import _set_policy

BUSYBOX = "busybox"
START_TIMEOUT = 60

pytestmark = pytest.mark.usefixtures("client")


@pytest.fixture
def run(new_sandbox):
    """Sandbox.run with the session tag on busybox; deletes what it made at test end (conftest)."""
    return functools.partial(new_sandbox, container_image=BUSYBOX)


@pytest.mark.timeout(90)
def test_dns_name_rules_are_echoed(run):
    rules = [EgressRule(dns_name="example.test"), EgressRule(dns_name="*.PyPI.org", ports=[443])]
    sb = run(network=NetworkOptions(egress=rules))
    sb.wait(timeout=START_TIMEOUT)
    want = ("example.test", "*.pypi.org")
    assert sb.dns_egress_names == want, sb.effective_egress
    assert Sandbox.from_id(sb.sandbox_id).result(timeout=20).dns_egress_names == want
    assert [r.dns_name for r in sb.effective_egress] == list(want)


@pytest.mark.timeout(90)
def test_platform_default_egress(run):
    sb = run()
    sb.wait(timeout=START_TIMEOUT)
    assert sb.effective_egress == (EgressRule(any=True), EgressRule(tenant=TenantScope.SAME_ORG))
    assert sb.dns_egress_names == ()
    assert sb.effective_ingress == ()


@pytest.mark.timeout(90)
def test_deny_egress_accepted(run):
    sb = run(network=NetworkOptions(deny_egress=True))
    sb.wait(timeout=START_TIMEOUT)
    assert sb.effective_egress == ()
    assert Sandbox.from_id(sb.sandbox_id).result(timeout=20).effective_egress == ()


@pytest.mark.timeout(60)
def test_malformed_rules_name_their_fields(run):
    with pytest.raises(CWSandboxValidationError) as caught:
        run(
            network=NetworkOptions(
                egress=[EgressRule(cidr="10.1.2.3/8"), EgressRule(any=True, ports=[{"port": 80, "protocol": "icmp"}])],
                ingress=[IngressRule(tenant=TenantScope.SANDBOX_NETWORK)],
            )
        ).wait(timeout=START_TIMEOUT)
    fields = {v.field for v in caught.value.field_violations}
    assert caught.value.reason == "CWSANDBOX_INVALID_REQUEST", caught.value
    assert fields == {
        "sandbox.spec.network.egress[0].cidr",
        "sandbox.spec.network.egress[1].ports[0].protocol",
        "sandbox.spec.network.ingress[0].tenant",
    }, fields


@pytest.fixture
def egress_envelope(client):
    _set_policy(client, {"constraints": {"network": {"allowed_egress": [{"https_hostname": "*.example.test"}, {"tenant": "SAME_ORG"}]}}})
    yield
    _set_policy(client, {})


@pytest.mark.timeout(90)
def test_policy_envelope(egress_envelope, run):
    with pytest.raises(CWSandboxValidationError) as caught:
        run(network=NetworkOptions(egress=[EgressRule(dns_name="elsewhere.test")])).wait(timeout=START_TIMEOUT)
    assert caught.value.reason == "CWSANDBOX_PLACEMENT_REJECTED", caught.value
    described = {v.field: v.description for v in caught.value.field_violations}
    assert "constraints.network.allowed_egress" in described.get("sandbox.spec.network.egress[0]", ""), described
    # Inside the envelope it runs; without rules it gets only the part of the platform
    # default the envelope covers.
    sb = run(network=NetworkOptions(egress=[EgressRule(dns_name="a.example.test")]))
    sb.wait(timeout=START_TIMEOUT)
    assert sb.dns_egress_names == ("a.example.test",)
    plain = run()
    plain.wait(timeout=START_TIMEOUT)
    assert plain.effective_egress == (EgressRule(tenant=TenantScope.SAME_ORG),)


@pytest.mark.timeout(90)
def test_custom_service_with_ingress(run):
    sb = run(
        services=[Service(port=9000, visibility="custom")],
        network=NetworkOptions(ingress=[IngressRule(tenant=TenantScope.SAME_ORG, ports=[9000])]),
    )
    sb.wait(timeout=START_TIMEOUT)
    assert sb.effective_ingress == (IngressRule(tenant=TenantScope.SAME_ORG, ports=[PortRange(port=9000)]),)
    assert (9000, "") in sb.exposed_ports, sb.exposed_ports
