package kubernetes

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

func warmSpec(org string) runtime.Spec {
	return runtime.Spec{
		Container: runtime.Container{Image: "busybox:1", Command: "sleep", Args: []string{"3600"},
			Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20}},
		Meta: map[string]string{runtime.MetaOrg: org},
	}
}

func TestWarmKey(t *testing.T) {
	base := warmSpec("org-a")
	k0, ok := warmKey(&base)
	if !ok || k0 == "" {
		t.Fatalf("a plain spec is not poolable")
	}
	// What the claim gives the agent, and what each create adds: the same key.
	same := map[string]func(*runtime.Spec){
		"id":            func(s *runtime.Spec) { s.ID = "abc" },
		"command":       func(s *runtime.Spec) { s.Command, s.Args = "sh", []string{"-c", "true"} },
		"env":           func(s *runtime.Spec) { s.Env = map[string]string{"A": "b"} },
		"files":         func(s *runtime.Spec) { s.Files = []runtime.File{{Path: "/x", Content: []byte("y")}} },
		"restart limit": func(s *runtime.Spec) { s.RestartLimit = 3 },
		"caller":        func(s *runtime.Spec) { s.Meta[runtime.MetaCaller] = "key-1" },
		"created at":    func(s *runtime.Spec) { s.Meta[runtime.MetaCreatedAt] = "now" },
		"default pids":  func(s *runtime.Spec) { s.Resources.Pids = runtime.DefaultPidsLimit },
	}
	for name, f := range same {
		s := base.Clone()
		f(&s)
		if k, ok := warmKey(&s); !ok || k != k0 {
			t.Errorf("%s: key %q ok %v, want %q", name, k, ok, k0)
		}
	}
	// What shapes the Pod, its policy, or whose it is: another key.
	other := map[string]func(*runtime.Spec){
		"org":           func(s *runtime.Spec) { s.Meta[runtime.MetaOrg] = "org-b" },
		"no org":        func(s *runtime.Spec) { delete(s.Meta, runtime.MetaOrg) },
		"image":         func(s *runtime.Spec) { s.Image = "busybox:2" },
		"memory":        func(s *runtime.Spec) { s.Resources.MemoryBytes = 512 << 20 },
		"runtime class": func(s *runtime.Spec) { s.RuntimeClass = "gvisor" },
		"working dir":   func(s *runtime.Spec) { s.WorkingDir = "/tmp" },
		"network":       func(s *runtime.Spec) { s.Network = &runtime.Network{DenyIngress: true} },
		"pod settings":  func(s *runtime.Spec) { s.Pod = &runtime.PodSettings{NodeSelector: map[string]string{"a": "b"}} },
		"security":      func(s *runtime.Spec) { s.Security = &runtime.Security{ReadOnlyRootFS: true} },
		"credentials":   func(s *runtime.Spec) { s.PullCredentials = &runtime.Credentials{Username: "u", Password: "p"} },
	}
	for name, f := range other {
		s := base.Clone()
		f(&s)
		if k, ok := warmKey(&s); ok && k == k0 {
			t.Errorf("%s: same key as the base spec", name)
		}
	}
	// Pull tokens rotate (minted per send): the key has whether there are credentials,
	// not their value.
	a, c := base.Clone(), base.Clone()
	a.PullCredentials = &runtime.Credentials{Username: "u", Password: "p1"}
	c.PullCredentials = &runtime.Credentials{Username: "u", Password: "p2"}
	if ka, _ := warmKey(&a); ka != func() string { k, _ := warmKey(&c); return k }() {
		t.Error("rotated credentials change the key")
	}
	// Shaped per create: not poolable.
	not := map[string]func(*runtime.Spec){
		"sidecar": func(s *runtime.Spec) { s.Sidecars = []runtime.Container{{Name: "b", Image: "busybox:1"}} },
		"volume":  func(s *runtime.Spec) { s.Volumes = []runtime.Volume{{Name: "v"}} },
		"secret refs": func(s *runtime.Spec) {
			s.SecretRefs = []runtime.SecretRef{{EnvVar: "A", Store: "s", Secret: "x", Key: "k"}}
		},
		"secret env":  func(s *runtime.Spec) { s.SecretEnv = map[string]string{"A": "b"} },
		"probe":       func(s *runtime.Spec) { s.StartupProbe = &runtime.Probe{Exec: []string{"true"}} },
		"share token": func(s *runtime.Spec) { s.ShareTokenHash = "h" },
		// A target's spec has no hash yet (the gateway makes one per create): its
		// SHARE_TOKEN endpoint makes it unpoolable as its creates are.
		"share-token endpoint": func(s *runtime.Spec) {
			s.Services = []runtime.Service{{Name: "web", Port: 8080, Endpoint: runtime.EndpointHTTPS, TokenAuth: true}}
		},
		"same user": func(s *runtime.Spec) {
			s.Network = &runtime.Network{Ingress: []runtime.IngressRule{{Tenant: runtime.TenantSameUser}}}
		},
	}
	for name, f := range not {
		s := base.Clone()
		f(&s)
		if _, ok := warmKey(&s); ok {
			t.Errorf("%s: poolable", name)
		}
	}
}

func TestAllocateWarm(t *testing.T) {
	tg := func(key string, size int) runtime.WarmTarget { return runtime.WarmTarget{Key: key, Size: size} }
	for _, c := range []struct {
		name    string
		targets []runtime.WarmTarget
		budget  int
		want    []int
	}{
		{"fits", []runtime.WarmTarget{tg("a/1", 2), tg("b/1", 1)}, 8, []int{2, 1}},
		{"round robin over orgs", []runtime.WarmTarget{tg("a/1", 5), tg("a/2", 5), tg("b/1", 5)}, 4, []int{1, 1, 2}},
		{"one org cannot take all", []runtime.WarmTarget{tg("a/1", 16), tg("b/1", 1)}, 3, []int{2, 1}},
		{"size bound", []runtime.WarmTarget{tg("a/1", 100)}, 100, []int{runtime.MaxWarmSize}},
		{"no budget", []runtime.WarmTarget{tg("a/1", 1)}, 0, []int{0}},
		{"negative size", []runtime.WarmTarget{tg("a/1", -1)}, 4, []int{0}},
	} {
		if got := allocateWarm(c.targets, c.budget); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// fakeWarm replaces the pool's refills with warm Pods made in memory (registered as
// sandboxes, so Destroy finds them), counting the calls.
type fakeWarm struct {
	mu    sync.Mutex
	made  []string
	fail  bool
	block chan struct{} // when set, each make waits for it
}

func (f *fakeWarm) install(b *Backend) {
	b.warm.makeFn = func(spec *runtime.Spec, key string) (*warmPod, error) {
		if f.block != nil {
			<-f.block
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.fail {
			return nil, errors.New("boom")
		}
		f.made = append(f.made, spec.ID)
		s := &sandbox{id: spec.ID, spec: *spec, changed: make(chan struct{}), done: make(chan struct{})}
		b.mu.Lock()
		b.sandboxes[spec.ID] = s
		b.mu.Unlock()
		return &warmPod{id: spec.ID, key: key, s: s}, nil
	}
}

func (f *fakeWarm) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.made)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWarmRefillBoundedAndHeldBackByCreates(t *testing.T) {
	b, _ := newFakeBackend(t, Config{MaxWarm: 3, MaxPrepull: -1})
	f := &fakeWarm{}
	f.install(b)
	// A Create in flight: no refill starts.
	leave := b.enterCreate(t.Context())
	if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{
		{Key: "org-a/t1", Spec: warmSpec("org-a"), Size: 2},
		{Key: "org-b/t1", Spec: warmSpec("org-b"), Size: 2},
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := f.count(); n != 0 {
		t.Fatalf("%d refills while a Create was in flight", n)
	}
	leave()
	// The budget (3) is shared: 2 for one org, 1 for the other; never more.
	waitFor(t, "3 ready", func() bool { return b.WarmStats().Ready == 3 })
	time.Sleep(300 * time.Millisecond)
	if st := b.WarmStats(); f.count() != 3 || st.Want != 3 || st.Ready != 3 {
		t.Errorf("made %d, stats %+v; want 3", f.count(), st)
	}
	// A reservation takes one out of the pool; no refill competes with its Create; once
	// that Create has run, the pool refills.
	spec := warmSpec("org-a")
	spec.Env = map[string]string{"X": "y"}
	id, ok := b.ReserveWarm(&spec)
	if !ok || !b.warm.owns(id) {
		t.Fatalf("no reservation for a matching spec (ok %v)", ok)
	}
	time.Sleep(300 * time.Millisecond)
	if n := f.count(); n != 3 {
		t.Fatalf("%d made while a reservation waited for its Create, want 3", n)
	}
	spec.ID, spec.Image = id, "other:1" // (a mismatch: the cold path, which the fake cannot take further)
	leave = b.enterCreate(t.Context())
	if _, claimed, err := b.claimWarm(t.Context(), &spec); claimed || err != nil {
		t.Fatal(claimed, err)
	}
	leave()
	waitFor(t, "refill after the reserved Create", func() bool { return f.count() == 4 })
	// Another organization's spec never gets this org's Pods.
	other := warmSpec("org-c")
	if _, ok := b.ReserveWarm(&other); ok {
		t.Error("a spec of an organization without a target got a warm pod")
	}
	// Targets gone: the warm Pods are destroyed.
	if err := b.SetWarmPools(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "warm pods dropped", func() bool { return b.WarmStats().Ready == 0 })
}

func TestWarmRefillBacksOffOnFailure(t *testing.T) {
	b, _ := newFakeBackend(t, Config{MaxWarm: 2, MaxPrepull: -1})
	f := &fakeWarm{fail: true}
	f.install(b)
	if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{{Key: "org-a/t1", Spec: warmSpec("org-a"), Size: 1}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed refill", func() bool { return b.WarmStats().Failed >= 1 })
	time.Sleep(time.Second) // below warmRetryMin: no second try
	if n := b.WarmStats().Failed; n != 1 {
		t.Errorf("%d failed refills within the first back-off, want 1", n)
	}
}

func TestWarmClaimFallsBackWhenDead(t *testing.T) {
	b, cs := newFakeBackend(t, Config{MaxWarm: 2, MaxPrepull: -1})
	f := &fakeWarm{}
	f.install(b)
	oneWarmReady(t, b)
	spec := warmSpec("org-a")
	id, ok := b.ReserveWarm(&spec)
	if !ok {
		t.Fatal("no reservation")
	}
	// Its Pod ends before the Create comes.
	s, _ := b.get(id)
	b.mu.Lock()
	close(s.done)
	b.mu.Unlock()
	if _, err := cs.CoreV1().Pods("sbx").Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets("sbx").Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(id), Namespace: "sbx"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cs.ClearActions()
	spec.ID = id
	_, claimed, err := b.claimWarm(t.Context(), &spec)
	if claimed || err != nil {
		t.Fatalf("claim of a dead warm pod: claimed %v err %v; want the cold path", claimed, err)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" {
			t.Errorf("a dead warm pod was claimed: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(id), metav1.GetOptions{}); err == nil {
		t.Error("the dead warm pod is still there for the cold create")
	}
	if _, err := b.get(id); err == nil {
		t.Error("the dead warm sandbox is still registered")
	}
	if st := b.WarmStats(); st.Fallback != 1 || st.Claims != 0 {
		t.Errorf("stats %+v", st)
	}
	// A Create of an ID that was never reserved is not a claim.
	spec.ID = "cold1"
	if _, claimed, _ := b.claimWarm(t.Context(), &spec); claimed {
		t.Error("claimed an unreserved id")
	}
}

func TestWarmClaimFallsBackOnMismatch(t *testing.T) {
	b, _ := newFakeBackend(t, Config{MaxWarm: 2, MaxPrepull: -1})
	f := &fakeWarm{}
	f.install(b)
	oneWarmReady(t, b)
	spec := warmSpec("org-a")
	id, ok := b.ReserveWarm(&spec)
	if !ok {
		t.Fatal("no reservation")
	}
	// The spec the Create brings differs in its image (changed between reserve and create).
	spec.ID, spec.Image = id, "busybox:2"
	if _, claimed, err := b.claimWarm(t.Context(), &spec); claimed || err != nil {
		t.Fatalf("mismatched claim: claimed %v err %v; want the cold path", claimed, err)
	}
	if st := b.WarmStats(); st.Fallback != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestWarmReservationExpires(t *testing.T) {
	b, _ := newFakeBackend(t, Config{MaxWarm: 1, MaxPrepull: -1})
	f := &fakeWarm{}
	f.install(b)
	var mu sync.Mutex
	now := time.Now()
	b.warm.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	oneWarmReady(t, b)
	spec := warmSpec("org-a")
	id, ok := b.ReserveWarm(&spec)
	if !ok {
		t.Fatal("no reservation")
	}
	mu.Lock()
	now = now.Add(warmReserveTTL + time.Second)
	mu.Unlock()
	b.warm.kick()
	waitFor(t, "the expired reservation destroyed", func() bool { _, err := b.get(id); return err != nil })
	if b.warm.owns(id) {
		t.Error("the expired reservation is still held")
	}
}

func TestRecoverDeletesUnclaimedWarmPods(t *testing.T) {
	lbl := func(warm bool) map[string]string {
		l := map[string]string{LabelManagedBy: ManagedBy, LabelRunner: "r1"}
		if warm {
			l[LabelWarm] = "k"
		}
		return l
	}
	pod := func(id string, warm bool, ann map[string]string) *corev1.Pod {
		l := lbl(warm)
		l[LabelSandbox] = id
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", Labels: l, Annotations: ann}}
	}
	_, clientPEM, clientKeyPEM, err := selfSigned("c")
	if err != nil {
		t.Fatal(err)
	}
	_, serverPEM, _, err := selfSigned("s")
	if err != nil {
		t.Fatal(err)
	}
	sec := func(id string, warm bool) *corev1.Secret {
		l := lbl(warm)
		l[LabelSandbox] = id
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(id), Namespace: "sbx", Labels: l},
			Data: map[string][]byte{
				secretSpec: []byte(`{"id":"` + id + `","image":"busybox"}`), gate.ConfigFile: []byte(`{"standby":true}`),
				secretClientCert: clientPEM, secretClientKey: clientKeyPEM, gate.TLSCertFile: serverPEM,
			}}
	}
	// unclaimed: both labelled warm. claimed1: the claim's Secret patch landed, not the
	// Pod's. claimed2: the Pod's landed, not the Secret's.
	b, cs := newFakeBackend(t, Config{MaxPrepull: -1},
		pod("unclaimed", true, nil), sec("unclaimed", true),
		pod("claimed1", true, nil), sec("claimed1", false),
		pod("claimed2", false, map[string]string{annotationWarmClaimed: "true"}), sec("claimed2", true))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(ctx, podName("unclaimed"), metav1.GetOptions{}); err == nil {
		t.Error("an unclaimed warm pod survived Recover")
	}
	if _, err := cs.CoreV1().Secrets("sbx").Get(ctx, secretName("unclaimed"), metav1.GetOptions{}); err == nil {
		t.Error("an unclaimed warm pod's secret survived Recover")
	}
	// A claim begun is the sandbox's: kept (reported, as a cold create cut short is).
	for _, id := range []string{"claimed1", "claimed2"} {
		if _, err := cs.CoreV1().Pods("sbx").Get(ctx, podName(id), metav1.GetOptions{}); err != nil {
			t.Errorf("a claimed warm pod was deleted by Recover: %v", err)
		}
	}
	if !unclaimedWarm(pod("x", true, nil), sec("x", true)) || unclaimedWarm(pod("x", true, nil), sec("x", false)) ||
		unclaimedWarm(pod("x", false, map[string]string{annotationWarmClaimed: "true"}), sec("x", true)) {
		t.Error("unclaimedWarm")
	}
	if !warmClaimBegun(pod("x", true, nil)) || !warmClaimBegun(pod("x", false, map[string]string{annotationWarmClaimed: "true"})) || warmClaimBegun(pod("x", false, nil)) {
		t.Error("warmClaimBegun")
	}
}

// TestWarmReleaseReturnsReservation: a reservation given back (its Create never reached
// the backend) is ready again at once: no refill is held back for a minute, no Pod made.
func TestWarmReleaseReturnsReservation(t *testing.T) {
	b, _ := newFakeBackend(t, Config{MaxWarm: 1, MaxPrepull: -1})
	f := &fakeWarm{}
	f.install(b)
	oneWarmReady(t, b)
	spec := warmSpec("org-a")
	id, ok := b.ReserveWarm(&spec)
	if !ok || b.WarmStats().Ready != 0 {
		t.Fatal("no reservation")
	}
	if h := b.WarmHeld(); len(h) != 1 || h[0].Resources.MilliCPU != 500 {
		t.Errorf("held while reserved: %+v, want the one warm pod's spec", h)
	}
	b.ReleaseWarm(id)
	if st := b.WarmStats(); st.Ready != 1 {
		t.Fatalf("after the release: %+v, want it ready", st)
	}
	if again, ok := b.ReserveWarm(&spec); !ok || again != id {
		t.Fatalf("reserve after the release: %q %v, want %q", again, ok, id)
	}
	if n := f.count(); n != 1 {
		t.Errorf("%d made, want 1", n)
	}
}

// TestWarmLabelOnPodAndSecretOnly: a refill's Create labels the Pod and its Secret
// LabelWarm (what Recover reads), never the NetworkPolicy nor the pull Secret: those
// stay a claimed sandbox's, and a cleanup by that label must not strip them.
func TestWarmLabelOnPodAndSecretOnly(t *testing.T) {
	b, cs := newFakeBackend(t, Config{MaxPrepull: -1})
	spec := warmSpec("org-a")
	spec.ID = "warm0001"
	spec.Network = &runtime.Network{Egress: runtime.DefaultEgress()}
	spec.PullCredentials = &runtime.Credentials{Username: "u", Password: "p"}
	spec.Image = "reg.test/org-a/app:1"
	ctx, cancel := context.WithCancel(context.WithValue(t.Context(), warmCtxKey{}, "k1"))
	done := make(chan struct{})
	go func() { defer close(done); _, _ = b.Create(ctx, &spec) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the warm pod", func() bool {
		_, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(spec.ID), metav1.GetOptions{})
		return err == nil
	})
	pod, _ := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(spec.ID), metav1.GetOptions{})
	sec, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName(spec.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelWarm] == "" || sec.Labels[LabelWarm] == "" {
		t.Errorf("pod %v / secret %v: want %s on both", pod.Labels, sec.Labels, LabelWarm)
	}
	np, err := cs.NetworkingV1().NetworkPolicies("sbx").Get(t.Context(), networkPolicyName(spec.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), pullSecretName(spec.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for what, l := range map[string]map[string]string{"network policy": np.Labels, "pull secret": ps.Labels} {
		if _, ok := l[LabelWarm]; ok || l[LabelSandbox] != spec.ID {
			t.Errorf("%s labels %v: want the sandbox's, without %s", what, l, LabelWarm)
		}
	}
}

// TestWarmRefillNotStarvedByCreates: Creates that keep overlapping hold refills back at
// most warmHoldMax each time: the pool still fills.
func TestWarmRefillNotStarvedByCreates(t *testing.T) {
	b, _ := newFakeBackend(t, Config{MaxWarm: 2, MaxPrepull: -1})
	f := &fakeWarm{}
	f.install(b)
	leave := b.enterCreate(t.Context()) // never leaves while the pool fills
	defer leave()
	if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{{Key: "org-a/t1", Spec: warmSpec("org-a"), Size: 2}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := f.count(); n != 0 {
		t.Fatalf("%d refills right away while a Create was in flight", n)
	}
	waitFor(t, "the pool filled under a steady load", func() bool { return b.WarmStats().Ready == 2 })
}

// TestWarmPodsRecycled: a ready warm Pod older than warmMaxAge is destroyed and
// replaced (a mutable tag's image moves on; warm Pods never wait forever).
func TestWarmPodsRecycled(t *testing.T) {
	b, _ := newFakeBackend(t, Config{MaxWarm: 1, MaxPrepull: -1})
	f := &fakeWarm{}
	f.install(b)
	var mu sync.Mutex
	now := time.Now()
	b.warm.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	oneWarmReady(t, b)
	first := func() string { f.mu.Lock(); defer f.mu.Unlock(); return f.made[0] }()
	mu.Lock()
	now = now.Add(warmMaxAge + time.Second)
	mu.Unlock()
	b.warm.kick()
	waitFor(t, "the old warm pod destroyed", func() bool { _, err := b.get(first); return err != nil })
	waitFor(t, "a new warm pod", func() bool { return f.count() == 2 && b.WarmStats().Ready == 1 })
}

// oneWarmReady sets one warm target of org-a of size 1 on b and waits for its Pod.
func oneWarmReady(t *testing.T, b *Backend) {
	t.Helper()
	if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{{Key: "org-a/t1", Spec: warmSpec("org-a"), Size: 1}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ready warm pod", func() bool { return b.WarmStats().Ready == 1 })
}
