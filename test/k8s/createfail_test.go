package k8s

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestContainerCreateFailure: a container the container runtime cannot create (runc
// fails `create`: the working dir is a regular file of the image, which runc cannot make
// a directory; the runner does not look into the image, so it does not refuse it up
// front) fails the sandbox within seconds, FAILED StartError naming the container and
// quoting runc's error, not CREATING until StartTimeout; nothing is left behind. Also a
// group's sidecar.
func TestContainerCreateFailure(t *testing.T) {
	c := needCluster(t)
	runnerID := randomID("cf-")
	const startTimeout = 3 * time.Minute
	s := newStack(t, c, runnerID, t.TempDir(), func(bc *kubernetes.Config) { bc.StartTimeout = startTimeout })
	t.Cleanup(func() {
		s.Close()
		deleteRunnerObjects(s.Client, c.namespace, runnerID)
	})
	r := s.Runner
	for _, tc := range []struct {
		name, container string
		spec            runtime.Spec
	}{
		{"single", "app", runtime.Spec{Container: runtime.Container{Name: "app", Image: busybox, Command: "sleep", Args: []string{"60"}, WorkingDir: "/etc/passwd"}}},
		{"sidecar", "web", runtime.Spec{
			Container: runtime.Container{Name: "app", Image: busybox, Command: "sleep", Args: []string{"60"}},
			Sidecars:  []runtime.Container{{Name: "web", Image: busybox, Command: "sleep", Args: []string{"60"}, WorkingDir: "/etc/passwd"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			sb, err := r.Create(context.Background(), runner.CreateRequest{Spec: tc.spec})
			if err != nil {
				t.Fatal(err)
			}
			sb = waitState(t, r, sb.ID, startTimeout/2, func(sb runner.Sandbox) bool { return sb.State.Terminal() || sb.State == runner.StateRunning })
			took := time.Since(start)
			t.Logf("%s after %s: %s: %s", sb.State, took.Round(time.Millisecond), sb.Reason, sb.Message)
			if sb.State != runner.StateFailed || sb.Reason != runner.ReasonStartError {
				t.Fatalf("%s %s, want FAILED StartError", sb.State, sb.Reason)
			}
			if !strings.Contains(sb.Message, `container "`+tc.container+`"`) || !strings.Contains(sb.Message, "not a directory") {
				t.Errorf("message %q does not name the container and runc's error", sb.Message)
			}
			// Seconds, not StartTimeout: the Pod's start on this loaded one-node cluster
			// takes 1-5 s.
			if took > 30*time.Second {
				t.Errorf("FAILED after %s (StartTimeout %s)", took, startTimeout)
			}
			sb = terminal(t, r, sb.ID)
			podGone(t, s, c, sb.ID)
		})
	}
}
