package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseConfig configures AcquireLease.
type LeaseConfig struct {
	// Client, when set, is used instead of Kubeconfig.
	Client     k8s.Interface
	Kubeconfig string // "" = in-cluster configuration
	Namespace  string
	Name       string // the Lease object
	Identity   string // this process (its Pod name)
	// LeaseDuration, RenewDeadline, RetryPeriod as in client-go's leader election;
	// defaults 15 s, 10 s, 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    *slog.Logger
}

// Lease is a held coordination.k8s.io Lease.
type Lease struct {
	// Lost is closed when the lease is lost (renewal failed) or released.
	Lost    <-chan struct{}
	cancel  context.CancelFunc
	stopped chan struct{}
}

// Release gives the lease up at once (the next candidate need not wait for it to expire)
// and returns when it is released.
func (l *Lease) Release() {
	l.cancel()
	<-l.stopped
}

// AcquireLease blocks until this process holds the Lease, so that of two runners started
// with the same configuration (a Deployment rolling over, a replica too many) only one
// acts on the cluster and the control plane at a time.
func AcquireLease(ctx context.Context, cfg LeaseConfig) (*Lease, error) {
	switch {
	case cfg.Namespace == "" || cfg.Name == "" || cfg.Identity == "":
		return nil, errors.New("lease: namespace, name and identity are required")
	case cfg.LeaseDuration <= 0:
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.RenewDeadline <= 0 {
		cfg.RenewDeadline = cfg.LeaseDuration * 2 / 3
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = max(cfg.RenewDeadline/5, 200*time.Millisecond)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	client := cfg.Client
	if client == nil {
		rc, err := RESTConfig(cfg.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("lease: kubernetes config: %w", err)
		}
		if client, err = k8s.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("lease: kubernetes client: %w", err)
		}
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	acquired, lost, stopped := make(chan struct{}), make(chan struct{}), make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, Name: cfg.Name,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(acquired) },
			OnStoppedLeading: func() { close(lost) },
		},
	})
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	// The election outlives ctx (which only bounds the wait): it runs until Release.
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(stopped)
		le.Run(lctx)
	}()
	cfg.Logger.Info("waiting for the runner lease", "lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity)
	select {
	case <-acquired:
		cfg.Logger.Info("holding the runner lease", "lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity)
		return &Lease{Lost: lost, cancel: cancel, stopped: stopped}, nil
	case <-ctx.Done():
		cancel()
		<-stopped
		return nil, fmt.Errorf("lease %s/%s: %w", cfg.Namespace, cfg.Name, context.Cause(ctx))
	}
}
