package security

import (
	"context"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestK8sHelloEgressNotWidened: with the gate's hello on and the runner's peers given as
// CIDRs (--runner-peer-cidrs), a deny_egress sandbox's NetworkPolicy opens UDP on the
// hello port to the runner's hello address only, never to the peer CIDRs: otherwise the
// sandbox could send UDP to every address in them — another sandbox listening on that
// port included — an exfiltration path under deny-all egress.
func TestK8sHelloEgressNotWidened(t *testing.T) {
	cs := fake.NewSimpleClientset()
	b, err := kubernetes.New(t.Context(), kubernetes.Config{Client: cs, Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1",
		MaxPrepull: -1, HelloListen: "127.0.0.1:0", HelloAddr: "10.244.0.5:7444",
		RunnerPeers: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.244.0.0/16"}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}},
		},
		Dial: func(context.Context, string, string) (net.Conn, error) { return nil, net.ErrClosed },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = b.Create(ctx, &runtime.Spec{ID: "exfil", Container: runtime.Container{Image: "busybox", Command: "sleep"},
			Network: &runtime.Network{DenyEgress: true}})
	}()
	var np *networkingv1.NetworkPolicy
	for deadline := time.Now().Add(10 * time.Second); np == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no network policy written")
		}
		if got, err := cs.NetworkingV1().NetworkPolicies("sbx").Get(t.Context(), "sbx-exfil", metav1.GetOptions{}); err == nil {
			np = got
		}
	}
	udp := 0
	for _, r := range np.Spec.Egress {
		dns := len(r.Ports) > 0 && r.Ports[0].Port != nil && r.Ports[0].Port.IntValue() == 53
		if dns {
			continue
		}
		udp++
		if len(r.Ports) != 1 || r.Ports[0].Protocol == nil || *r.Ports[0].Protocol != corev1.ProtocolUDP || r.Ports[0].Port.IntValue() != 7444 {
			t.Errorf("non-DNS egress rule on %+v, want UDP 7444 only", r.Ports)
		}
		for _, to := range r.To {
			if to.IPBlock == nil || to.IPBlock.CIDR != "10.244.0.5/32" {
				t.Errorf("deny_egress sandbox may send to %+v on %+v", to, r.Ports)
			}
		}
		if len(r.To) == 0 {
			t.Errorf("deny_egress sandbox may send anywhere on %+v", r.Ports)
		}
	}
	if udp != 1 {
		t.Errorf("%d non-DNS egress rules, want the hello's only", udp)
	}
}
