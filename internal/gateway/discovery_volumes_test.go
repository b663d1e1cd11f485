package gateway

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestDiscoveryStorageClasses: a runner's available_storage_classes are its policy's
// allowed storage classes, else its default class.
func TestDiscoveryStorageClasses(t *testing.T) {
	for doc, want := range map[string][]string{
		`{"base":{"volume_storage_class":"fast"},"constraints":{"volumes":{"allowed_storage_classes":["fast","slow"]}}}`: {"fast", "slow"},
		`{"base":{"volume_storage_class":"fast"}}`: {"fast"},
		`{}`: nil,
	} {
		be := runtimetest.NewFake()
		t.Cleanup(be.Close)
		rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rr.Close)
		keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("r1", rr)}, Policies: staticPolicy(doc), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		ctx := auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "k", Org: "acme", Role: auth.RoleUser})
		res, err := s.GetAvailableRunner(ctx, connect.NewRequest(&sandboxv1.GetAvailableRunnerRequest{RunnerId: "r1", OrganizationId: "acme", View: sandboxv1.RunnerView_RUNNER_VIEW_BASIC}))
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Msg.GetCapabilities().GetAvailableStorageClasses(); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", doc, got, want)
		}
	}
}
