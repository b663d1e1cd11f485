package runnerapi

import (
	"reflect"
	"testing"

	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestCheckpointRefEgressOnTheWire: a ref's egress state (CA, key, injections) survives
// the runner wire unchanged, a ref without one stays without, and a hostile number of
// injections is cut to one more than any state has (the importing runner refuses it).
func TestCheckpointRefEgressOnTheWire(t *testing.T) {
	ref := runner.CheckpointRef{Key: "checkpoints/a/b/manifest.json", Platform: "p", Bytes: 7, Egress: &runtime.EgressState{
		CACert: []byte{1, 2, 3}, CAKey: []byte{4, 5},
		Injections: []runtime.EgressInjection{{Host: "api.example.com", Header: "Authorization", Placeholder: "sbx-secret-00", Secret: "prod/api#token"}},
	}}
	if got := refFromProto(refToProto(ref)); !reflect.DeepEqual(got, ref) {
		t.Fatalf("round trip: %+v, want %+v", got, ref)
	}
	plain := runner.CheckpointRef{Key: "checkpoints/a/b/manifest.json", Platform: "p"}
	if got := refFromProto(refToProto(plain)); got.Egress != nil {
		t.Fatalf("a ref without egress state got %v", got.Egress)
	}
	many := ref
	many.Egress = &runtime.EgressState{CACert: []byte{1}, CAKey: []byte{2}}
	for range 10 * egress.MaxStateInjections {
		many.Egress.Injections = append(many.Egress.Injections, ref.Egress.Injections[0])
	}
	if got := refFromProto(refToProto(many)); len(got.Egress.Injections) != egress.MaxStateInjections+1 {
		t.Fatalf("%d injections taken from the wire", len(got.Egress.Injections))
	}
}
