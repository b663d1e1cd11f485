package security

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1/runnerv1connect"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// sizeRecordingVolumes is a backend that holds managed volumes and records every size it
// was asked to make.
type sizeRecordingVolumes struct {
	*runtimetest.Fake
	mu    sync.Mutex
	sizes []int64
}

func (f *sizeRecordingVolumes) ManagedUnavailable() string { return "" }
func (f *sizeRecordingVolumes) EnsureManaged(_ string, size int64) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sizes = append(f.sizes, size)
	return size, nil
}
func (f *sizeRecordingVolumes) RemoveManaged(string) error { return nil }

// TestRunnerAPIVolumeSizeAttack: a caller of the runner API itself (not the gateway,
// which bounds spec.size) asks a runner to make registered volumes of 2 TiB, 1 EiB and
// the largest int64: the runner refuses each with INVALID_ARGUMENT naming
// volume.spec.size, and its backend is asked to make nothing. A fork target carrying more
// egress secret values than a sandbox may have is refused likewise, before any fork.
func TestRunnerAPIVolumeSizeAttack(t *testing.T) {
	be := &sizeRecordingVolumes{Fake: runtimetest.NewFake()}
	t.Cleanup(be.Close)
	r, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	srv := httptest.NewServer(runnerapi.NewServer("r1", r, nil).Handler())
	t.Cleanup(srv.Close)
	c := runnerv1connect.NewRunnerServiceClient(srv.Client(), srv.URL)
	ctx := context.Background()
	for _, size := range []int64{2 << 40, 1 << 60, 1<<63 - 1} {
		_, err := c.EnsureVolume(ctx, connect.NewRequest(&runnerv1.EnsureVolumeRequest{Volume: &runnerv1.RegisteredVolume{
			OrganizationId: "org-a", ClaimName: "huge", Namespace: runner.VolumeNamespace, SizeBytes: size}}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "volume.spec.size") {
			t.Errorf("size %d = %v", size, err)
		}
	}
	be.mu.Lock()
	made := be.sizes
	be.mu.Unlock()
	if len(made) != 0 {
		t.Fatalf("the backend was asked to make volumes of %v bytes", made)
	}
	values := map[string]string{}
	for i := range runtime.MaxSecretEnvVars + 1 {
		values[fmt.Sprintf("prod/k%d", i)] = strings.Repeat("v", 64)
	}
	_, err = c.Fork(ctx, connect.NewRequest(&runnerv1.ForkRequest{Id: "nope", Targets: []*runnerv1.ForkTarget{{Id: "fork-x", EgressSecretValues: values}}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "egress_secret_values") {
		t.Errorf("fork with %d egress secret values = %v", len(values), err)
	}
}
