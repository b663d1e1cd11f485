package runnerapi

import (
	"reflect"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestSupportOverTheWire: what a runner cannot do (runtime.Support) reaches the gateway
// as the runner said it, each lack alone and all together: a capability added to Support
// that the runner wire does not carry fails here (the other hops embed Support whole).
func TestSupportOverTheWire(t *testing.T) {
	var all runtime.Support
	cases := []runtime.Support{{}}
	typ := reflect.TypeFor[runtime.Support]()
	// notSent are the lacks only the runner itself acts on (it refuses at create, and the
	// gateway tries the next runner): not on the wire, they arrive false.
	notSent := map[string]bool{"NoGlobalVolumeSubPaths": true}
	sent := func(s runtime.Support) runtime.Support {
		v := reflect.ValueOf(&s).Elem()
		for i := range typ.NumField() {
			if notSent[typ.Field(i).Name] {
				v.Field(i).SetBool(false)
			}
		}
		return s
	}
	for i := range typ.NumField() {
		if typ.Field(i).Type.Kind() != reflect.Bool {
			t.Fatalf("runtime.Support.%s is no bool: teach this test (and the wire) about it", typ.Field(i).Name)
		}
		var one runtime.Support
		reflect.ValueOf(&one).Elem().Field(i).SetBool(true)
		reflect.ValueOf(&all).Elem().Field(i).SetBool(true)
		cases = append(cases, one)
	}
	cases = append(cases, all)
	for _, want := range cases {
		c := runner.Capacity{Support: want, EdgeDomain: "edge.example.test", EdgePort: 443, EngineImage: "engine:test", EngineRuntimeClass: "gvisor"}
		if want.NoContainerEngine {
			c.EngineUnavailable = "it has no engine image"
		}
		if want.NoEndpoints {
			c.EdgeDomain, c.EdgePort = "", 0 // a runner without an edge says so by its domain
		}
		got := capacityFromProto(capacityToProto(c))
		if got.Support != sent(want) {
			t.Errorf("sent %+v, the gateway got %+v", want, got.Support)
		}
		if want.NoContainerEngine && got.EngineUnavailable != c.EngineUnavailable {
			t.Errorf("sent why no engine %q, the gateway got %q", c.EngineUnavailable, got.EngineUnavailable)
		}
		if !want.NoContainerEngine && (got.EngineImage != c.EngineImage || got.EngineRuntimeClass != c.EngineRuntimeClass) {
			t.Errorf("sent engine %q under %q, the gateway got %q under %q", c.EngineImage, c.EngineRuntimeClass, got.EngineImage, got.EngineRuntimeClass)
		}
	}
	// A runner that says nothing (one from before share tokens or without an edge) has
	// neither endpoints nor share tokens nor a container engine.
	if got := capacityFromProto(nil).Support; !got.NoShareTokens || !got.NoEndpoints || got.NoDNSEgress || !got.NoContainerEngine {
		t.Errorf("a runner that says nothing: %+v", got)
	}
}
