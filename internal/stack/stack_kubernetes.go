package stack

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// KubernetesConfig configures a runner on the Kubernetes backend.
type KubernetesConfig struct {
	// Kubeconfig is a kubeconfig file; "" = in-cluster configuration.
	Kubeconfig string
	Namespace  string
	RunnerID   string
	AgentImage string
	// ImagePullPolicy; "" = IfNotPresent.
	ImagePullPolicy corev1.PullPolicy
	// RuntimeClasses: see kubernetes.Config.
	RuntimeClasses map[string]string
	// RunnerPeers and DNSPeers: see kubernetes.Config.
	RunnerPeers, DNSPeers []networkingv1.NetworkPolicyPeer
	// DiskBytes and OpenReserved: see kubernetes.Config.
	DiskBytes    int64
	OpenReserved []netip.Prefix
	DataDir      string // the runner's own files (archived logs)
	Retention    time.Duration
	ExpiryGrace  time.Duration
	Logger       *slog.Logger
	// Blobs, BlobConfig and the snapshot limits: see runner.Config (nil: no file-system
	// snapshots).
	Blobs                                   blob.Store
	BlobConfig                              blobconfig.Config
	SnapshotsPerSandbox, SnapshotsPerRunner int
	// PlatformRegistry and PlatformRegistryHTTP: see kubernetes.Config.
	PlatformRegistry     string
	PlatformRegistryHTTP bool
	// MaxPrepull and PrepullInFlight: see kubernetes.Config.
	MaxPrepull, PrepullInFlight int
	// HelloListen and HelloAddr: see kubernetes.Config.
	HelloListen, HelloAddr string
	// MaxWarm: see kubernetes.Config.
	MaxWarm int
	// Backend, when set, overrides the fields above that configure the backend; Client
	// and Namespace are filled in when empty.
	Backend *kubernetes.Config
}

// KubernetesStack is a runner driving Pods.
type KubernetesStack struct {
	Client  k8s.Interface
	Backend *kubernetes.Backend
	Runner  *runner.Runner
}

// RESTConfig loads a kubeconfig file, or the in-cluster configuration for "".
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// NewKubernetes builds the backend and the runner, and re-adopts the runner's Pods.
func NewKubernetes(ctx context.Context, cfg KubernetesConfig) (*KubernetesStack, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rc, err := RESTConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("stack: kubernetes config: %w", err)
	}
	rc.QPS, rc.Burst = 50, 100
	client, err := k8s.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("stack: kubernetes client: %w", err)
	}
	bc := kubernetes.Config{
		Namespace: cfg.Namespace, RunnerID: cfg.RunnerID, AgentImage: cfg.AgentImage,
		ImagePullPolicy: cfg.ImagePullPolicy, RuntimeClasses: cfg.RuntimeClasses, Logger: cfg.Logger,
		RunnerPeers: cfg.RunnerPeers, DNSPeers: cfg.DNSPeers, DiskBytes: cfg.DiskBytes, OpenReserved: cfg.OpenReserved,
		PlatformRegistry: cfg.PlatformRegistry, PlatformRegistryHTTP: cfg.PlatformRegistryHTTP,
		MaxPrepull: cfg.MaxPrepull, PrepullInFlight: cfg.PrepullInFlight, MaxWarm: cfg.MaxWarm,
		HelloListen: cfg.HelloListen, HelloAddr: cfg.HelloAddr,
	}
	if cfg.Backend != nil {
		bc = *cfg.Backend
	}
	if bc.Client == nil {
		bc.Client = client
	}
	if bc.Namespace == "" {
		bc.Namespace = cfg.Namespace
	}
	if bc.LogDir == "" {
		// Next to the runner's archive: the runner renames a copy into it.
		bc.LogDir = filepath.Join(cfg.DataDir, "runner", "k8s-logs")
	}
	if bc.SnapshotCacheDir == "" {
		// The archives volumes are restored from (used only with a blob store).
		bc.SnapshotCacheDir = filepath.Join(cfg.DataDir, "runner", "k8s-snapshots")
	}
	backend, err := kubernetes.New(ctx, bc)
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	r, err := runner.New(ctx, runner.Config{
		Backend:     backend,
		DataDir:     filepath.Join(cfg.DataDir, "runner"),
		Retention:   cfg.Retention,
		ExpiryGrace: cfg.ExpiryGrace,
		Logger:      cfg.Logger,
		Blobs:       cfg.Blobs,
		BlobConfig:  cfg.BlobConfig,

		SnapshotsPerSandbox: cfg.SnapshotsPerSandbox,
		SnapshotsPerRunner:  cfg.SnapshotsPerRunner,
	})
	if err != nil {
		backend.Close()
		return nil, fmt.Errorf("stack: runner: %w", err)
	}
	return &KubernetesStack{Client: client, Backend: backend, Runner: r}, nil
}

// Close stops following sandboxes; their Pods keep running for the next runner.
func (s *KubernetesStack) Close() {
	s.Runner.Close()
	s.Backend.Close()
}
