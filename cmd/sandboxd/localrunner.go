package main

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/dataplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// The start-up of a runner on this machine, shared by `runner` and `dev`: what gateways
// place on (the runner with its capacity), its edge and direct data plane, and what its
// heartbeats report.

// newLocalRunner is rn as runner id, admitting sandboxes by capacity (validated);
// builds hand base images in through images (nil: the backend cannot, no builds).
func newLocalRunner(id string, rn *runner.Runner, capacity capacityFlags, images runner.BaseArchiver) (*runner.Local, error) {
	if err := capacity.parse(); err != nil {
		return nil, err
	}
	l := runner.NewLocal(id, rn)
	capacity.apply(l)
	metrics.Default.RegisterSandboxUsage(func(limit int) []metrics.SandboxUsage {
		us := rn.Usages(limit)
		out := make([]metrics.SandboxUsage, len(us))
		for i, u := range us {
			out[i] = metrics.SandboxUsage{ID: u.ID, Org: u.Org, CPUUsec: u.CPUUsec, MemoryBytes: u.MemoryBytes, MemoryPeakBytes: u.MemoryPeakBytes}
		}
		return out
	})
	l.BuildImages = images
	return l, nil
}

// startEdge starts the edge that publishes the endpoints of l's sandboxes (ec without
// SessionKeyFile: the session key is kept in DATA-DIR/edge-session.key) and tells l where
// the endpoints are.
func startEdge(l *runner.Local, ec stack.EdgeConfig, dataDir string) (*stack.Edge, error) {
	ec.SessionKeyFile = filepath.Join(dataDir, "edge-session.key")
	e, err := stack.StartEdge(l.R, ec)
	if err != nil {
		return nil, err
	}
	l.EdgeDomain, l.EdgePort = ec.BaseDomain, e.Port()
	return e, nil
}

// startDataPlane serves l's sandboxes on the direct data plane dc (without Sandboxes) and
// tells l its URI.
func startDataPlane(l *runner.Local, dc dataplane.ListenConfig) (*dataplane.Listener, error) {
	dc.Sandboxes = l
	dc.Interceptors = append(dc.Interceptors, metrics.Default.Interceptor(metrics.PathDirect))
	ln, uri, err := dataplane.Start(dc)
	if err != nil {
		return nil, err
	}
	l.DataPlaneURI = uri
	fmt.Printf("direct data plane: %s\n", uri)
	return ln, nil
}

// runnerStatus is what a heartbeat reports of a runner whose capacity is c: this binary's
// version, ready, what it offers and what its live sandboxes request.
func runnerStatus(c runner.Capacity) controlplane.Status {
	return controlplane.Status{
		Version:  version,
		Ready:    true,
		Capacity: controlplane.Resources{MilliCPU: c.MilliCPU, MemoryBytes: c.MemoryBytes},
		Usage:    controlplane.Resources{MilliCPU: c.UsedMilliCPU, MemoryBytes: c.UsedMemoryBytes, Sandboxes: int64(c.Running)},
	}
}

// enrollStatus is what a registered runner's heartbeat reports of l: its runnerStatus and
// the number of its sandboxes, ended ones included.
func enrollStatus(ctx context.Context, l *runner.Local) (*enroll.Status, error) {
	c, err := l.Capacity(ctx)
	if err != nil {
		return nil, err
	}
	s := runnerStatus(c)
	return &enroll.Status{
		Version:        s.Version,
		Ready:          s.Ready,
		Capacity:       resourcesProto(s.Capacity),
		Usage:          resourcesProto(s.Usage),
		SandboxesTotal: int64(len(l.R.List())),
		Prepull:        prepullStatus(l),
		// The control plane sends the desired release's checksums for it (self-update);
		// startHeartbeat sets SelfUpdate.
		Arch: runtime.GOARCH,
	}, nil
}

func resourcesProto(r controlplane.Resources) *controlplanev1.RunnerResources {
	return &controlplanev1.RunnerResources{MilliCpu: r.MilliCPU, MemoryBytes: r.MemoryBytes, Sandboxes: r.Sandboxes}
}
