package local

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func setWarm(t *testing.T, b *Backend, targets ...runtime.WarmTarget) {
	t.Helper()
	if err := b.SetWarmPools(context.Background(), targets); err != nil {
		t.Fatal(err)
	}
}

// A warm target keeps its containers ready before any Create of the image, past the idle
// time, refilled after a claim; within MaxTargeted; an untargeted set returns to the idle
// rules.
func TestPoolWarmTargets(t *testing.T) {
	const idle = 500 * time.Millisecond
	e := poolEnvCfg(t, PoolConfig{Size: 0, Idle: idle, MaxTargeted: 3}) // no pool for plain creates
	bb := runtime.Spec{Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"inf"}}}

	// Not poolable here: left out (pull credentials; a volume).
	creds := bb
	creds.PullCredentials = &runtime.Credentials{Username: "u", Password: "p"}
	vol := bb
	vol.Volumes = []runtime.Volume{{Name: "v", Medium: runtime.MediumMemory}}
	setWarm(t, e.b, runtime.WarmTarget{Key: "a/creds", Spec: creds, Size: 2}, runtime.WarmTarget{Key: "a/vol", Spec: vol, Size: 2})
	if st := e.b.PoolStats(); st.Targeted != 0 {
		t.Fatalf("unpoolable targets kept: %+v", st)
	}

	setWarm(t, e.b, runtime.WarmTarget{Key: "a/bb", Spec: bb, Size: 2})
	waitPoolReady(t, e.b, 2) // no Create of busybox yet: the pull happens for the target
	if st := e.b.PoolStats(); st.Targeted != 2 || st.Refills != 2 || st.Claims != 0 {
		t.Fatalf("stats %+v", st)
	}
	time.Sleep(3 * idle) // targeted: exempt from idle expiry
	if st := e.b.PoolStats(); st.Ready != 2 || st.Dropped != 0 {
		t.Fatalf("targeted set expired: %+v", st)
	}

	// A create of the target's spec claims; the pool refills to the target.
	s := bb
	s.ID = "warm-claim"
	e.create(s)
	if st := e.b.PoolStats(); st.Claims != 1 {
		t.Fatalf("create not served from the warm target: %+v", st)
	}
	waitPoolReady(t, e.b, 2)
	if err := e.b.Destroy(context.Background(), "warm-claim"); err != nil {
		t.Fatal(err)
	}

	// MaxTargeted bounds the total (targets in key order).
	setWarm(t, e.b, runtime.WarmTarget{Key: "b", Spec: bb, Size: 16}, runtime.WarmTarget{Key: "a", Spec: bb, Size: 1})
	if st := e.b.PoolStats(); st.Targeted != 3 {
		t.Fatalf("bounded targets: %+v", st)
	}
	waitPoolReady(t, e.b, 3)

	// Untargeted: back to the idle rules (Size 0 here: dropped after idle).
	setWarm(t, e.b)
	deadline := time.Now().Add(15 * time.Second)
	for e.b.PoolStats().Ready > 0 || len(poolDirs(e.state)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("untargeted set kept: %+v %v", e.b.PoolStats(), poolDirs(e.state))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := e.b.PoolStats(); st.Targeted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// regImages serves regRef to any credentials, as the image store serves a cached
// digest-pinned reference without asking the registry: only the pool's keying can keep
// one organization from another's pooled container then. It records the credentials
// of each pull.
type regImages struct {
	testImages
	mu    sync.Mutex
	pulls []string // passwords, "" without credentials
}

const regRef = "reg.test:5000/org-a/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func (r *regImages) Pull(ctx context.Context, ref string, creds *runtime.Credentials) (*Image, error) {
	if ref != regRef {
		return r.testImages.Pull(ctx, ref, creds)
	}
	r.mu.Lock()
	pw := ""
	if creds != nil {
		pw = creds.Password
	}
	r.pulls = append(r.pulls, pw)
	r.mu.Unlock()
	if creds == nil {
		return nil, fmt.Errorf("%w: %s", image.ErrUnauthorized, ref)
	}
	return &Image{Ref: ref, Digest: "sha256:a0a0", Layers: r.layers, Config: ImageConfig{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}}}, nil
}

func (r *regImages) passwords() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.pulls...)
}

// A warm target with pull credentials (a platform-registry image, org-a's) is refilled
// with them and kept for org-a only: org-b's Create of the same image, with its own
// credentials, never claims it (even when the image store would let it pull), nor does
// a Create without credentials; org-a's Create claims it. A resend's fresh credentials
// are the ones the next refill pulls with.
func TestPoolWarmTargetCredentialsPerOrg(t *testing.T) {
	e := newEnv(t)
	imgs := &regImages{testImages: testImages{layers: []string{busyboxDir}}}
	b, err := New(Config{OCIRuntime: testOCIRuntime,
		StateDir: e.state, AgentBinary: agentBin, CgroupParent: testCgroupParent, Images: imgs,
		Pool:       PoolConfig{Size: 0, Idle: time.Minute, MaxTargeted: 4},
		MaxPrepull: -1, // the pulls counted here are the pool's (prepull_test.go)
		Logger:     slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	t.Cleanup(func() {
		if err := b.Close(context.Background()); err != nil {
			t.Errorf("close pool: %v", err)
		}
		if d := poolDirs(e.state); len(d) > 0 {
			t.Errorf("pooled containers left after Close: %v", d)
		}
	})
	spec := func(org, token string) runtime.Spec {
		s := runtime.Spec{Container: runtime.Container{Image: regRef, Command: "sleep", Args: []string{"inf"}}, Meta: map[string]string{runtime.MetaOrg: org}}
		if token != "" {
			s.PullCredentials = &runtime.Credentials{Username: "sandboxd", Password: token}
		}
		return s
	}
	// Credentials without an organization to key them by: left out.
	noOrg := spec("", "tok-a-0")
	setWarm(t, b, runtime.WarmTarget{Key: "org-a/t", Spec: noOrg, Size: 1})
	if st := b.PoolStats(); st.Targeted != 0 {
		t.Fatalf("a target with credentials and no organization was kept: %+v", st)
	}

	setWarm(t, b, runtime.WarmTarget{Key: "org-a/t", Spec: spec("org-a", "tok-a-1"), Size: 1})
	waitPoolReady(t, b, 1)
	if p := imgs.passwords(); len(p) != 1 || p[0] != "tok-a-1" {
		t.Fatalf("refill pulls %q, want one with org-a's token", p)
	}

	// org-b, with credentials of its own: cold, the pooled container stays.
	other := spec("org-b", "tok-b-1")
	other.ID = "org-b-sbx"
	e.create(other)
	// Without credentials (any organization): the pull is refused, nothing claimed.
	anon := spec("org-a", "")
	anon.ID = "anon-sbx"
	if _, err := b.Create(context.Background(), &anon); err == nil {
		t.Fatal("a create without credentials ran org-a's registry image")
	}
	if st := b.PoolStats(); st.Claims != 0 || st.Ready != 1 {
		t.Fatalf("org-b or an anonymous create claimed org-a's warm container: %+v", st)
	}
	if err := b.Destroy(context.Background(), "org-b-sbx"); err != nil {
		t.Fatal(err)
	}

	// A resend with fresh credentials; org-a's create claims, the refill uses the new ones.
	setWarm(t, b, runtime.WarmTarget{Key: "org-a/t", Spec: spec("org-a", "tok-a-2"), Size: 1})
	mine := spec("org-a", "tok-a-create")
	mine.ID = "org-a-sbx"
	e.create(mine)
	if st := b.PoolStats(); st.Claims != 1 {
		t.Fatalf("org-a's create did not claim its warm container: %+v", st)
	}
	waitPoolReady(t, b, 1)
	p := imgs.passwords()
	if last := p[len(p)-1]; last != "tok-a-2" {
		t.Fatalf("pulls %q: the refill after the claim did not use the resent token", p)
	}
	if err := b.Destroy(context.Background(), "org-a-sbx"); err != nil {
		t.Fatal(err)
	}
}

// The pool's keys (no root): credentials key a container by organization; a Create
// with credentials and no organization has no key; without credentials the
// organization does not matter.
func TestPoolKeyOf(t *testing.T) {
	mk := func(org string, creds bool) *runtime.Spec {
		s := &runtime.Spec{Container: runtime.Container{Image: regRef}, Meta: map[string]string{runtime.MetaOrg: org}}
		if creds {
			s.PullCredentials = &runtime.Credentials{Username: "u", Password: "p"}
		}
		return s
	}
	ka, ok := poolKeyOf(mk("org-a", true), "runc")
	if !ok || ka.org != "org-a" {
		t.Fatalf("org-a with credentials: %+v %v", ka, ok)
	}
	kb, _ := poolKeyOf(mk("org-b", true), "runc")
	if kb == ka {
		t.Fatal("org-a's and org-b's credentialed keys are equal")
	}
	if _, ok := poolKeyOf(mk("", true), "runc"); ok {
		t.Fatal("credentials without an organization got a key")
	}
	pa, _ := poolKeyOf(mk("org-a", false), "runc")
	pb, _ := poolKeyOf(mk("org-b", false), "runc")
	if pa != pb || pa.org != "" || pa == ka {
		t.Fatalf("keys without credentials: %+v %+v (credentialed %+v)", pa, pb, ka)
	}
	// take serves only the exact key.
	p := &pool{sets: map[poolKey]*poolSet{ka: {ready: []*pooled{{}}}}, targets: map[poolKey]int{}}
	if p.take(kb) != nil || p.take(pa) != nil {
		t.Fatal("another organization's (or an anonymous) key took org-a's container")
	}
	if p.take(ka) == nil {
		t.Fatal("org-a's key did not take its container")
	}
}
