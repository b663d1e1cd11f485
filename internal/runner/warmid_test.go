package runner

import (
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

type reserverStub struct {
	runtime.Backend
	id string
}

func (s reserverStub) ReserveWarm(*runtime.Spec) (string, bool) { return s.id, s.id != "" }

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
		r.assignID(&s)
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
	if r.assignID(&s); s.ID != "gw1" {
		t.Errorf("no warm pod: id %q", s.ID)
	}
	s = runtime.Spec{}
	if r.assignID(&s); !validIDForTest(s.ID) {
		t.Errorf("no warm pod, no id: %q", s.ID)
	}
}

func validIDForTest(id string) bool { return runtime.ValidID(id, 63) }
