package runner

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

type reserverStub struct {
	runtime.Backend
	id string
}

func (s reserverStub) ReserveWarm(*runtime.Spec) (string, bool) { return s.id, s.id != "" }
func (s reserverStub) ReleaseWarm(string)                       {}

func TestAssignIDTakesWarmID(t *testing.T) {
	r := &Runner{backend: reserverStub{id: "warm1"}}
	for _, c := range []struct {
		name string
		spec runtime.Spec
		want string
	}{
		{"no id", runtime.Spec{}, "warm1"},
		{"gateway's id, any id taken", runtime.Spec{ID: "gw1", Meta: map[string]string{runtime.MetaAnyID: "true"}}, "warm1"},
		{"a caller's own id", runtime.Spec{ID: "mine"}, "mine"},
		{"share token made for the id", runtime.Spec{ID: "gw1", ShareTokenHash: "h", Meta: map[string]string{runtime.MetaAnyID: "true"}}, "gw1"},
	} {
		s := c.spec
		r.assignID(&s, nil)
		if s.ID != c.want {
			t.Errorf("%s: id %q, want %q", c.name, s.ID, c.want)
		}
		if _, ok := s.Meta[runtime.MetaAnyID]; ok {
			t.Errorf("%s: %s kept in the spec", c.name, runtime.MetaAnyID)
		}
	}
	// Nothing warm: the gateway's ID stays, an unnamed sandbox gets a new one.
	r = &Runner{backend: reserverStub{}}
	s := runtime.Spec{ID: "gw1", Meta: map[string]string{runtime.MetaAnyID: "true"}}
	if r.assignID(&s, nil); s.ID != "gw1" {
		t.Errorf("no warm pod: id %q", s.ID)
	}
	s = runtime.Spec{}
	if r.assignID(&s, nil); !validIDForTest(s.ID) {
		t.Errorf("no warm pod, no id: %q", s.ID)
	}
}

func validIDForTest(id string) bool { return runtime.ValidID(id, 63) }

// reservingFake is a Fake backend with a warm pool of one ID: it notes whether each
// reservation's spec carried pull credentials, and the IDs released.
type reservingFake struct {
	*runtimetest.Fake
	id       string
	mu       sync.Mutex
	creds    []bool
	released []string
}

func (b *reservingFake) ReserveWarm(spec *runtime.Spec) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.creds = append(b.creds, spec.PullCredentials != nil)
	return b.id, true
}

func (b *reservingFake) ReleaseWarm(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.released = append(b.released, id)
}

// TestCreateReservesWithCredentials: a create whose image is pulled with credentials
// reserves a warm sandbox for the spec the backend gets (with them: the warm pool's key
// has whether it had), though the runner strips them from what it keeps; a create that
// returns before the backend's Create (the ID is taken) gives its reservation back.
func TestCreateReservesWithCredentials(t *testing.T) {
	be := &reservingFake{Fake: runtimetest.NewFake(), id: "warm1"}
	t.Cleanup(be.Close)
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	spec := runtime.Spec{Container: runtime.Container{Image: "reg.test/org/app:1", PullCredentials: &runtime.Credentials{Username: "u", Password: "p"}},
		Meta: map[string]string{runtime.MetaAnyID: "true", runtime.MetaOrg: "org-a"}}
	spec.ID = "gw1"
	sb, err := r.Create(context.Background(), CreateRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "warm1" {
		t.Fatalf("created as %q, want the warm reservation's", sb.ID)
	}
	be.mu.Lock()
	got := slices.Clone(be.creds)
	be.mu.Unlock()
	if !slices.Equal(got, []bool{true}) {
		t.Errorf("reservations saw credentials %v, want [true]", got)
	}
	if sb.Spec.PullCredentials != nil {
		t.Error("the sandbox keeps its pull credentials")
	}
	// The pool answers with the same ID again: taken, so the reservation is given back.
	spec.Meta = map[string]string{runtime.MetaAnyID: "true", runtime.MetaOrg: "org-a"}
	if _, err := r.Create(context.Background(), CreateRequest{Spec: spec}); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("second create: %v, want ErrAlreadyExists", err)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if !slices.Equal(be.released, []string{"warm1"}) {
		t.Errorf("released %v, want [warm1]", be.released)
	}
}

// holdingFake is a Fake backend keeping warm sandboxes that hold their requests.
type holdingFake struct {
	*runtimetest.Fake
	held []runtime.Spec
}

func (b *holdingFake) WarmHeld() []runtime.Spec { return b.held }

// TestCapacityCountsWarmHeld: warm sandboxes that hold their requests on the runner's
// nodes (Kubernetes warm Pods) count as used capacity, so placement does not overcommit.
func TestCapacityCountsWarmHeld(t *testing.T) {
	w := runtime.Spec{Container: runtime.Container{Image: "busybox:1", Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20}}}
	be := &holdingFake{Fake: runtimetest.NewFake(), held: []runtime.Spec{w, w}}
	t.Cleanup(be.Close)
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	c, err := NewLocal("r1", r).Capacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.UsedMilliCPU != 1000 || c.UsedMemoryBytes != 512<<20 {
		t.Errorf("used %dm CPU, %d bytes: want the two warm sandboxes' 1000m, 512 MiB", c.UsedMilliCPU, c.UsedMemoryBytes)
	}
}
