package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// testEgress is a runner's egress proxy and DNS as a Config.Egress: the egress Service's
// address, the runner Pod's selector, its listen ports.
func testEgress() *EgressConfig {
	return &EgressConfig{
		ProxyAddrs: []netip.Addr{netip.MustParseAddr("10.96.0.53")},
		DNSAddr:    netip.MustParseAddr("10.96.0.53"),
		Peers: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "sandboxd"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "runner"}},
		}},
		ProxyPort: 15443, DNSPort: 5353,
	}
}

func hostNameSpec(id string, rules ...runtime.EgressRule) *runtime.Spec {
	return &runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"60"}},
		Network: &runtime.Network{Egress: rules}}
}

// TestEgressNetworkPolicy: with the runner's egress configured, a host-name rule becomes
// one egress rule to the runner's proxy and DNS ports (no ipBlock for a name), beside
// the other rules and the cluster DNS; under deny-all egress nothing; without the
// configuration the rule is still refused.
func TestEgressNetworkPolicy(t *testing.T) {
	const (
		dns    = "ns:kubernetes.io/metadata.name=kube-system UDP/53,TCP/53"
		runner = "ns:kubernetes.io/metadata.name=sandboxd&pods:app=runner TCP/15443,UDP/5353,TCP/5353"
	)
	b, _ := newFakeBackend(t, Config{Egress: testEgress(), MaxPrepull: -1})
	spec := hostNameSpec("np-1", runtime.EgressRule{DNSName: "api.example.com"}, runtime.EgressRule{CIDR: "203.0.113.0/24"},
		runtime.EgressRule{DNSName: "*.example.org", Ports: []runtime.PortRange{{Port: 443}}})
	np, err := b.networkPolicyFor(spec, b.labels(spec))
	if err != nil {
		t.Fatal(err)
	}
	_, out := describePolicy(np)
	if want := []string{dns, "ip:203.0.113.0/24 all", runner}; !slices.Equal(out, want) {
		t.Errorf("egress\n got %q\nwant %q", out, want)
	}
	for _, r := range np.Spec.Egress {
		for _, p := range r.To {
			if p.IPBlock != nil && strings.Contains(p.IPBlock.CIDR, "example") {
				t.Errorf("an ipBlock names a host: %v", p.IPBlock)
			}
		}
	}
	deny := hostNameSpec("np-2", runtime.EgressRule{DNSName: "api.example.com"})
	deny.Network.DenyEgress = true
	np, err = b.networkPolicyFor(deny, b.labels(deny))
	if err != nil {
		t.Fatal(err)
	}
	if _, out := describePolicy(np); !slices.Equal(out, []string{dns}) {
		t.Errorf("deny-all egress: %q, want the cluster DNS only", out)
	}

	plain, _ := newFakeBackend(t, Config{MaxPrepull: -1})
	if _, err := plain.networkPolicyFor(spec, plain.labels(spec)); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("without Egress: %v, want ErrInvalidSpec", err)
	}
}

// madePodsWith runs one Create of spec on a backend with cfg against a fake API server
// and returns the Pods and the sandbox Secret it made (the create never finishes).
func madePodsWith(t *testing.T, cfg Config, spec *runtime.Spec) ([]*corev1.Pod, *corev1.Secret, error) {
	t.Helper()
	cfg.StartTimeout, cfg.MaxPrepull = time.Second, -1
	b, cs := newFakeBackend(t, cfg)
	var mu sync.Mutex
	var made []*corev1.Pod
	var sec *corev1.Secret
	cs.PrependReactor("create", "*", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch o := a.(k8stesting.CreateAction).GetObject().(type) {
		case *corev1.Pod:
			made = append(made, o.DeepCopy())
		case *corev1.Secret:
			if o.Name == secretName(spec.ID) {
				sec = o.DeepCopy()
			}
		}
		return false, nil, nil
	})
	cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer ccancel()
	_, err := b.Create(cctx, spec)
	mu.Lock()
	defer mu.Unlock()
	return made, sec, err
}

// TestEgressPodDNS: the Pod of a sandbox with host-name rules has the runner's DNS as its
// only nameserver (dnsPolicy None, ndots 1, no search), NET_RAW dropped in every
// container, and its workload held until its address is registered; a Pod without
// host-name rules, or on a runner without Egress, keeps the cluster DNS and starts at once.
func TestEgressPodDNS(t *testing.T) {
	spec := hostNameSpec("dns-1", runtime.EgressRule{DNSName: "api.example.com"})
	pods, sec, _ := madePodsWith(t, Config{Egress: testEgress()}, spec)
	if len(pods) == 0 || sec == nil {
		t.Fatal("the Create made no Pod or Secret")
	}
	p := pods[0]
	if p.Spec.DNSPolicy != corev1.DNSNone || p.Spec.DNSConfig == nil ||
		!slices.Equal(p.Spec.DNSConfig.Nameservers, []string{"10.96.0.53"}) || len(p.Spec.DNSConfig.Searches) != 0 ||
		len(p.Spec.DNSConfig.Options) != 1 || p.Spec.DNSConfig.Options[0].Name != "ndots" || *p.Spec.DNSConfig.Options[0].Value != "1" {
		t.Errorf("DNS policy %q config %+v, want None with the runner's DNS only, ndots 1", p.Spec.DNSPolicy, p.Spec.DNSConfig)
	}
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "NET_RAW") && !slices.Contains(sc.Capabilities.Drop, "ALL") ||
			slices.Contains(sc.Capabilities.Add, "NET_RAW") {
			t.Errorf("container %s keeps NET_RAW: %+v", c.Name, sc)
		}
	}
	var cfg agentconfig.Config
	if err := json.Unmarshal(sec.Data[gate.ConfigFile], &cfg); err != nil {
		t.Fatal(err)
	}
	if !cfg.Standby || len(cfg.Argv) != 0 {
		t.Errorf("the workload is not held until its address is registered: standby %v argv %q", cfg.Standby, cfg.Argv)
	}

	for name, tc := range map[string]struct {
		cfg  Config
		spec *runtime.Spec
	}{
		"no host-name rule": {Config{Egress: testEgress()}, hostNameSpec("dns-2", runtime.EgressRule{CIDR: "203.0.113.0/24"})},
		"deny-all egress": {Config{Egress: testEgress()}, func() *runtime.Spec {
			s := hostNameSpec("dns-3", runtime.EgressRule{DNSName: "a.example.com"})
			s.Network.DenyEgress = true
			return s
		}()},
		"no network at all":  {Config{Egress: testEgress()}, hostNameSpec("dns-4")},
		"runner sans egress": {Config{}, hostNameSpec("dns-5", runtime.EgressRule{CIDR: "203.0.113.0/24"})},
	} {
		t.Run(name, func(t *testing.T) {
			pods, sec, _ := madePodsWith(t, tc.cfg, tc.spec)
			if len(pods) == 0 || sec == nil {
				t.Fatal("the Create made no Pod or Secret")
			}
			if p := pods[0]; p.Spec.DNSPolicy != "" || p.Spec.DNSConfig != nil {
				t.Errorf("DNS policy %q config %+v, want the cluster's default", p.Spec.DNSPolicy, p.Spec.DNSConfig)
			}
			var cfg agentconfig.Config
			if err := json.Unmarshal(sec.Data[gate.ConfigFile], &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.Standby {
				t.Error("held in standby without host-name rules")
			}
			// On a runner serving host-name rules every sandbox Pod drops NET_RAW,
			// with such rules or not (it could forge a registered Pod's address).
			if tc.cfg.Egress != nil {
				for _, c := range append(slices.Clone(pods[0].Spec.InitContainers), pods[0].Spec.Containers...) {
					sc := c.SecurityContext
					if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "NET_RAW") && !slices.Contains(sc.Capabilities.Drop, "ALL") ||
						slices.Contains(sc.Capabilities.Add, "NET_RAW") {
						t.Errorf("container %s keeps NET_RAW: %+v", c.Name, sc)
					}
				}
			}
		})
	}
}

// TestEgressRefusals: egress secrets are refused on a runner without Egress and beside
// init containers, as is a container adding NET_RAW beside host-name rules; nothing is
// made then. Without Egress the backend reports NoDNSEgress and NoEgressSecrets, with it
// neither; New refuses an incomplete Egress.
func TestEgressRefusals(t *testing.T) {
	secret := hostNameSpec("ref-1", runtime.EgressRule{DNSName: "api.example.com", Secret: &runtime.EgressSecret{Store: "s", Path: "p", EnvVar: "TOKEN"}})
	secret.EgressSecretValues = map[string]string{"s/p": "v"}
	secretInit := hostNameSpec("ref-1b", runtime.EgressRule{DNSName: "api.example.com", Secret: &runtime.EgressSecret{Store: "s", Path: "p", EnvVar: "TOKEN"}})
	secretInit.EgressSecretValues = map[string]string{"s/p": "v"}
	secretInit.Name = "main"
	secretInit.InitContainers = []runtime.Container{{Name: "init", Image: "busybox", Command: "true"}}
	raw := hostNameSpec("ref-2", runtime.EgressRule{DNSName: "api.example.com"})
	raw.Security = &runtime.Security{CapAdd: []string{"CAP_NET_RAW"}}
	// Without host-name rules of its own, on a runner that serves them: its raw sockets
	// could forge another Pod's registered address all the same.
	rawPlain := hostNameSpec("ref-3", runtime.EgressRule{CIDR: "203.0.113.0/24"})
	rawPlain.Security = &runtime.Security{CapAdd: []string{"CAP_NET_RAW"}}
	rawNoNet := hostNameSpec("ref-4")
	rawNoNet.Network = nil
	rawNoNet.Security = &runtime.Security{CapAdd: []string{"CAP_NET_RAW"}}
	for _, tc := range []struct {
		cfg  Config
		spec *runtime.Spec
		want string
	}{
		{Config{}, secret, "sandboxd_secret: this Kubernetes runner has no egress proxy to inject egress secrets"},
		{Config{Egress: testEgress()}, secretInit, "sandboxd_secret: egress secrets are not given to sandboxes with init containers on Kubernetes runners yet"},
		{Config{Egress: testEgress()}, raw, "security.cap_add: CAP_NET_RAW is not allowed on Kubernetes runners that serve host-name egress rules"},
		{Config{Egress: testEgress()}, rawPlain, "security.cap_add: CAP_NET_RAW is not allowed on Kubernetes runners that serve host-name egress rules"},
		{Config{Egress: testEgress()}, rawNoNet, "security.cap_add: CAP_NET_RAW is not allowed on Kubernetes runners that serve host-name egress rules"},
	} {
		pods, _, err := madePodsWith(t, tc.cfg, tc.spec)
		if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidSpec with %q", tc.spec.ID, err, tc.want)
		}
		if len(pods) != 0 {
			t.Errorf("%s: a Pod was made", tc.spec.ID)
		}
	}

	plain, _ := newFakeBackend(t, Config{MaxPrepull: -1})
	if !plain.Support().NoDNSEgress {
		t.Error("a runner without Egress reports host-name rules enforceable")
	}
	configured, _ := newFakeBackend(t, Config{MaxPrepull: -1, Egress: testEgress()})
	if sup := configured.Support(); sup.NoDNSEgress || sup.NoEgressSecrets {
		t.Errorf("a runner with Egress reports %+v, want host names and egress secrets", sup)
	}
	if sup := plain.Support(); !sup.NoEgressSecrets {
		t.Errorf("a runner without Egress reports %+v, want no egress secrets", sup)
	}
	for name, mod := range map[string]func(*EgressConfig){
		"no proxy":  func(c *EgressConfig) { c.ProxyAddrs = nil },
		"no DNS":    func(c *EgressConfig) { c.DNSAddr = netip.Addr{} },
		"no peers":  func(c *EgressConfig) { c.Peers = nil },
		"bad ports": func(c *EgressConfig) { c.DNSPort = 0 },
	} {
		e := testEgress()
		mod(e)
		cfg := Config{Client: fake.NewSimpleClientset(), Namespace: "sbx", RunnerID: "r1", AgentImage: "a", Egress: e}
		if _, err := New(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "Egress") {
			t.Errorf("%s: New: %v, want an Egress error", name, err)
		}
	}
}

// TestEgressRegistryFollowsPod: a sandbox Pod's address is in the egress registry, with
// its host-name grants, only while the Pod is this runner's, the sandbox's own (UID) and
// live; it leaves at the deletion timestamp, a terminal phase, the delete event, an
// address change, and before the backend deletes the Pod itself. Another runner's Pod,
// a Pod of another UID and a sandbox without host-name rules are never registered.
func TestEgressRegistryFollowsPod(t *testing.T) {
	ip1, ip2 := netip.MustParseAddr("10.244.0.7"), netip.MustParseAddr("10.244.0.8")
	b, _ := newFakeBackend(t, Config{Egress: testEgress(), MaxPrepull: -1})
	add := func(id string, spec *runtime.Spec, uid types.UID) *sandbox {
		s := &sandbox{id: id, spec: *spec, uid: uid, changed: make(chan struct{}), done: make(chan struct{})}
		b.mu.Lock()
		b.sandboxes[id] = s
		b.mu.Unlock()
		return s
	}
	pod := func(id string, uid types.UID, runner string, phase corev1.PodPhase, ips ...netip.Addr) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", UID: uid,
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelRunner: runner, LabelSandbox: id}},
			Status: corev1.PodStatus{Phase: phase}}
		for _, a := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: a.String()})
		}
		if len(ips) > 0 {
			p.Status.PodIP = ips[0].String()
		}
		return p
	}
	grantsAt := func(a netip.Addr) []string {
		g, ok := b.EgressSource(a)
		if !ok {
			return nil
		}
		return g
	}
	spec := hostNameSpec("reg-1", runtime.EgressRule{DNSName: "API.example.com."}, runtime.EgressRule{DNSName: "*.example.org"})
	spec.Meta = map[string]string{runtime.MetaOrg: "org-r"}
	want := []string{"api.example.com", "*.example.org"}

	add("reg-1", spec, "u1")
	b.observe(pod("reg-1", "u1", "r1", corev1.PodPending), false)
	if _, ok := b.EgressSource(ip1); ok {
		t.Error("registered before the Pod has an address")
	}
	b.observe(pod("reg-1", "u1", "r1", corev1.PodRunning, ip1), false)
	if got := grantsAt(ip1); !slices.Equal(got, want) {
		t.Fatalf("running: grants %q, want %q", got, want)
	}
	if g := b.EgressGrants(ip1); !slices.Equal(g, want) {
		t.Errorf("EgressGrants %q", g)
	}
	if g := b.EgressGrants(netip.MustParseAddr("::ffff:10.244.0.7")); !slices.Equal(g, want) {
		t.Errorf("an IPv4-mapped source: grants %q", g)
	}
	if g := b.EgressGroup(ip1); g != "org-r" {
		t.Errorf("EgressGroup %q, want the sandbox's organization org-r", g)
	}
	b.observe(pod("reg-1", "u1", "r1", corev1.PodRunning, ip2), false)
	if _, ok := b.EgressSource(ip1); ok {
		t.Error("the old address stayed after an IP change")
	}
	if got := grantsAt(ip2); !slices.Equal(got, want) {
		t.Errorf("new address: grants %q", got)
	}
	deleting := pod("reg-1", "u1", "r1", corev1.PodRunning, ip2)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	b.observe(deleting, false)
	if _, ok := b.EgressSource(ip2); ok {
		t.Error("registered after the deletion timestamp")
	}

	for name, end := range map[string]func(id string){
		"terminal phase": func(id string) { b.observe(pod(id, "u2", "r1", corev1.PodFailed, ip1), false) },
		"delete event":   func(id string) { b.observe(pod(id, "u2", "r1", corev1.PodRunning, ip1), true) },
		"backend delete": func(id string) {
			b.mu.Lock()
			s := b.sandboxes[id]
			b.mu.Unlock()
			if err := b.deletePod(t.Context(), s, 0); err != nil {
				t.Fatal(err)
			}
			if _, ok := b.EgressSource(ip1); ok {
				t.Error("registered once the backend deleted the Pod")
			}
			// A late event of the Pod (still running as the API last said) does not
			// bring it back.
			b.observe(pod(id, "u2", "r1", corev1.PodRunning, ip1), false)
		},
	} {
		t.Run(name, func(t *testing.T) {
			id := "reg-" + strings.ReplaceAll(name, " ", "-")
			add(id, hostNameSpec(id, runtime.EgressRule{DNSName: "api.example.com"}), "u2")
			b.observe(pod(id, "u2", "r1", corev1.PodRunning, ip1), false)
			if _, ok := b.EgressSource(ip1); !ok {
				t.Fatal("not registered while running")
			}
			end(id)
			if _, ok := b.EgressSource(ip1); ok {
				t.Errorf("registered after the %s", name)
			}
		})
	}

	// Not this sandbox's Pod: another runner's (before the create knows its UID; or
	// even one with the UID), or another UID.
	add("reg-2", hostNameSpec("reg-2", runtime.EgressRule{DNSName: "api.example.com"}), "")
	b.observe(pod("reg-2", "x1", "r2", corev1.PodRunning, ip1), false)
	if _, ok := b.EgressSource(ip1); ok {
		t.Error("another runner's Pod was registered before the create knew its UID")
	}
	add("reg-2b", hostNameSpec("reg-2b", runtime.EgressRule{DNSName: "api.example.com"}), "x2")
	b.observe(pod("reg-2b", "x2", "r2", corev1.PodRunning, ip1), false)
	if _, ok := b.EgressSource(ip1); ok {
		t.Error("another runner's Pod was registered")
	}
	add("reg-3", hostNameSpec("reg-3", runtime.EgressRule{DNSName: "api.example.com"}), "u3")
	b.observe(pod("reg-3", "x3", "r1", corev1.PodRunning, ip1), false)
	if _, ok := b.EgressSource(ip1); ok {
		t.Error("a Pod of another UID was registered")
	}
	add("reg-4", hostNameSpec("reg-4", runtime.EgressRule{CIDR: "203.0.113.0/24"}), "u4")
	b.observe(pod("reg-4", "u4", "r1", corev1.PodRunning, ip1), false)
	if _, ok := b.EgressSource(ip1); ok {
		t.Error("a sandbox without host-name rules was registered")
	}

	// A backend without Egress registers nothing.
	plain, _ := newFakeBackend(t, Config{MaxPrepull: -1})
	ps := &sandbox{id: "reg-5", spec: *hostNameSpec("reg-5", runtime.EgressRule{DNSName: "api.example.com"}), uid: "u5",
		changed: make(chan struct{}), done: make(chan struct{})}
	plain.mu.Lock()
	plain.sandboxes["reg-5"] = ps
	plain.mu.Unlock()
	plain.observe(pod("reg-5", "u5", "r1", corev1.PodRunning, ip1), false)
	if _, ok := plain.EgressSource(ip1); ok {
		t.Error("a backend without Egress registered a source")
	}
}

// TestEgressWarmClaimWaitsForRegistration: a warm Pod of a sandbox with host-name rules
// can be ready before the informer reports its address; its claim does not Start the
// workload until the address is in the egress registry (its first query would be
// REFUSED), and Starts it once it is.
func TestEgressWarmClaimWaitsForRegistration(t *testing.T) {
	b, cs := newFakeBackend(t, Config{MaxWarm: 1, MaxPrepull: -1, Egress: testEgress(), StartTimeout: 30 * time.Second})
	f := &fakeWarm{}
	f.install(b)
	a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY, startOK: true}
	_, h := agentv1connect.NewAgentServiceHandler(a)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}
	ws := warmSpec("org-a")
	ws.Network = &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.example.com"}}}
	if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{{Key: "org-a/t1", Spec: ws, Size: 1}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ready warm pod", func() bool { return b.WarmStats().Ready == 1 })
	spec := warmSpec("org-a")
	spec.Network = &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.example.com"}}}
	id, ok := b.ReserveWarm(&spec)
	if !ok {
		t.Fatal("no reservation")
	}
	b.warm.mu.Lock()
	w := b.warm.reserved[id]
	w.hc, w.dial = agent.NewHTTPClient(dial), dial
	b.warm.mu.Unlock()
	b.mu.Lock()
	w.s.uid = "u-warm"
	b.mu.Unlock()
	if _, err := cs.CoreV1().Pods("sbx").Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", UID: "u-warm"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets("sbx").Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(id), Namespace: "sbx"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec.ID = id
	type result struct {
		claimed bool
		err     error
	}
	done := make(chan result, 1)
	go func() {
		_, claimed, err := b.claimWarm(t.Context(), &spec)
		done <- result{claimed, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the claim returned before the Pod's address was registered: claimed %v, %v (Starts %d)", r.claimed, r.err, a.startCount())
	case <-time.After(500 * time.Millisecond):
	}
	if n := a.startCount(); n != 0 {
		t.Fatalf("the workload was started %d times before the Pod's address was registered", n)
	}
	ip := netip.MustParseAddr("10.244.0.9")
	b.observe(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", UID: "u-warm",
		Labels: map[string]string{LabelManagedBy: ManagedBy, LabelRunner: "r1", LabelSandbox: id}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}}, false)
	select {
	case r := <-done:
		if !r.claimed || r.err != nil {
			t.Fatalf("claim after registration: claimed %v, %v", r.claimed, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the claim did not go on once the address was registered")
	}
	if n := a.startCount(); n != 1 {
		t.Errorf("Starts %d, want 1", n)
	}
	if g := b.EgressGrants(ip); !slices.Equal(g, []string{"api.example.com"}) {
		t.Errorf("grants %q", g)
	}
}

// TestEgressIPCollision: a stale sandbox A (its Pod gone from the network, its end not
// yet seen) and a new sandbox B whose Pod got A's address: B's registration replaces
// A's, and A's removal afterwards (its delete event, or the backend deleting it) keeps
// B's entry with B's grants.
func TestEgressIPCollision(t *testing.T) {
	ip := netip.MustParseAddr("10.244.0.20")
	b, _ := newFakeBackend(t, Config{Egress: testEgress(), MaxPrepull: -1})
	pod := func(id string, uid types.UID) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", UID: uid,
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelRunner: "r1", LabelSandbox: id}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}}
	}
	for name, removeA := range map[string]func(a *sandbox){
		"delete event": func(*sandbox) { b.observe(pod("col-a", "ua"), true) },
		"terminal phase": func(*sandbox) {
			p := pod("col-a", "ua")
			p.Status.Phase = corev1.PodFailed
			b.observe(p, false)
		},
		"backend delete": func(a *sandbox) {
			if err := b.deletePod(t.Context(), a, 0); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			a := &sandbox{id: "col-a", spec: *hostNameSpec("col-a", runtime.EgressRule{DNSName: "a.example.com"}), uid: "ua",
				changed: make(chan struct{}), done: make(chan struct{})}
			bb := &sandbox{id: "col-b", spec: *hostNameSpec("col-b", runtime.EgressRule{DNSName: "b.example.com"}), uid: "ub",
				changed: make(chan struct{}), done: make(chan struct{})}
			b.mu.Lock()
			b.sandboxes["col-a"], b.sandboxes["col-b"] = a, bb
			b.mu.Unlock()
			t.Cleanup(func() {
				b.mu.Lock()
				delete(b.sandboxes, "col-a")
				delete(b.sandboxes, "col-b")
				b.mu.Unlock()
				b.egressMu.Lock()
				delete(b.egressBySrc, ip)
				b.egressMu.Unlock()
			})
			b.observe(pod("col-a", "ua"), false)
			if g := b.EgressGrants(ip); !slices.Equal(g, []string{"a.example.com"}) {
				t.Fatalf("A registered: grants %q", g)
			}
			b.observe(pod("col-b", "ub"), false)
			if g := b.EgressGrants(ip); !slices.Equal(g, []string{"b.example.com"}) {
				t.Fatalf("B on A's address: grants %q, want B's", g)
			}
			removeA(a)
			if g := b.EgressGrants(ip); !slices.Equal(g, []string{"b.example.com"}) {
				t.Errorf("after A's %s: grants %q, want B's kept", name, g)
			}
		})
	}
}
