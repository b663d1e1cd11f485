package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/store"

	corev1 "k8s.io/api/core/v1"
)

// A runner created with the cluster_id of a cluster its organization registered is
// installed by the control plane, asynchronously: its install record goes INSTALLING at
// create, a goroutine applies the chart's objects (package install) and waits for the
// runner's first heartbeat (INSTALLED), or records why it failed (FAILED, with the
// Kubernetes error and hints). Every step is bounded (InstallConfig timeouts). The record
// is in the store, so a restarted control plane re-drives the INSTALLING ones
// (ResumeInstalls): applying is idempotent (server-side apply).
//
// An update of an installed runner (:applyAvailableUpdate, a rollout step: UpdateStarting
// before its desired version is written, UpdateStarted after) re-applies the same way: the
// record goes INSTALLING again, the goroutine applies the whole object set with the current
// InstallConfig and the runner image tagged with the update's version (runnerImage), and
// the record goes INSTALLED once the new Pod heartbeats (heartbeatSince: since the apply,
// on that version) or FAILED with the reason; an update that comes meanwhile applies again
// (the install generation). While the record is not INSTALLED the runner's
// heartbeats carry no desired version (Heartbeat), so it does not move its image by itself
// ahead of (or without) its objects: a failed re-apply leaves it on its version, FAILED,
// and the update step ends at its deadline.

// InstallConfig configures installs (flags --install-* of `sandboxd controlplane`).
type InstallConfig struct {
	// RunnerImage and AgentImage are the images installed runners run; both required to
	// install (else installs fail with CWSANDBOX_INSTALL_NOT_CONFIGURED).
	RunnerImage string
	AgentImage  string
	// ControlPlaneAddress is HOST:PORT of the control plane as installed runners reach it.
	ControlPlaneAddress string
	// PullPolicy is the runner image's; SandboxPullPolicy the sandbox and agent images'.
	PullPolicy        string
	SandboxPullPolicy string
	// StorageClass of the runner's data volume; "" the cluster's default.
	StorageClass string
	// BaseDomain of installed runners' edges; "" the runner's default.
	BaseDomain string
	// ExtraArgs are appended to the runner's arguments.
	ExtraArgs []string
	// PrepullImages is the runners' --prepull-images (install.Values); nil the chart's
	// default (64), 0 none (and no ClusterRole).
	PrepullImages *int
	// RuntimeClasses is the runners' --runtime-classes (install.Values.RuntimeClasses);
	// nil: not passed (runc only). Installs fail with CWSANDBOX_INSTALL_NOT_CONFIGURED
	// while install.CheckRuntimeClasses refuses it.
	RuntimeClasses map[string]string
	// Egress gives installed runners the egress proxy and DNS (install.Values.Egress: the
	// chart's egress.enabled): the Service and NetworkPolicy install.EgressName and the
	// runner's --egress-* args. Off, an install deletes both. Like every setting here it
	// takes effect at an install (a runner created, or an INSTALLING one resumed at start)
	// and at an installed runner's update (UpdateStarted: :applyAvailableUpdate, a rollout
	// step re-applies its objects); changing it alone re-applies nothing. Installs fail with
	// CWSANDBOX_INSTALL_NOT_CONFIGURED while install.CheckExtraArgs refuses ExtraArgs with it.
	Egress bool
	// ApplyTimeout bounds applying the objects; default 2 minutes.
	ApplyTimeout time.Duration
	// HeartbeatTimeout bounds the wait for the first heartbeat after applying; default 10 minutes.
	HeartbeatTimeout time.Duration
	// NewTarget connects to a cluster; default install.NewTarget. Tests inject failures.
	NewTarget func(*rest.Config) (install.Target, error)
}

// Install reasons the control plane itself produces (install.Diagnose gives the others).
const (
	reasonNotConfigured = apierr.InstallNotConfigured
	reasonCredential    = apierr.InstallCredential
	reasonNoHeartbeat   = apierr.InstallNoHeartbeat
)

type installer struct {
	s   *Service
	cfg InstallConfig

	mu      sync.Mutex
	base    context.Context
	running map[string]context.CancelFunc // org/runner -> its install's cancel
	// gen counts, by org/runner, the installs and update re-applies asked for (start, UpdateStarting):
	// an install records INSTALLED only while the generation it applied for is current.
	gen map[string]uint64
	wg  sync.WaitGroup
}

func newInstaller(s *Service, cfg InstallConfig) *installer {
	if cfg.ApplyTimeout <= 0 {
		cfg.ApplyTimeout = 2 * time.Minute
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = 10 * time.Minute
	}
	if cfg.NewTarget == nil {
		cfg.NewTarget = install.NewTarget
	}
	return &installer{s: s, cfg: cfg, base: context.Background(), running: map[string]context.CancelFunc{}, gen: map[string]uint64{}}
}

// ResumeInstalls re-drives the installs a previous control plane left INSTALLING, and
// makes ctx the parent of every install from now on (cancel it to stop them).
func (s *Service) ResumeInstalls(ctx context.Context) error {
	s.inst.mu.Lock()
	s.inst.base = ctx
	s.inst.mu.Unlock()
	ins, err := s.st.Installs().ListState(ctx, store.InstallInstalling)
	if err != nil {
		return fmt.Errorf("resume installs: %w", err)
	}
	for _, in := range ins {
		s.log.Info("resuming runner install", "org", in.Org, "runner", in.RunnerID, "cluster", in.ClusterID)
		s.inst.start(in.Org, in.RunnerID)
	}
	return nil
}

// WaitInstalls waits for running installs to end (tests).
func (s *Service) WaitInstalls() { s.inst.wg.Wait() }

// registeredCluster returns the cluster runner r is installed into, if its cluster_id is a
// cluster registered for r's organization; another organization's cluster of that id is
// as good as none (its runners are self-managed, and nothing says the cluster exists).
func (s *Service) registeredCluster(ctx context.Context, r store.Runner) (store.Cluster, bool, error) {
	c, err := s.st.Clusters().Get(ctx, r.ClusterID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Cluster{}, false, nil
	case err != nil:
		return store.Cluster{}, false, err
	}
	return c, c.Org == r.Org, nil
}

// beginInstall records a new runner's install and starts it when its cluster is
// registered; it returns the record (nil for a self-managed runner).
func (s *Service) beginInstall(ctx context.Context, r store.Runner) (*store.Install, error) {
	_, ok, err := s.registeredCluster(ctx, r)
	if err != nil || !ok {
		return nil, err
	}
	in, err := s.st.Installs().Put(ctx, store.Install{Org: r.Org, RunnerID: r.RunnerID, ClusterID: r.ClusterID,
		State: store.InstallInstalling, Namespace: install.Namespace(r.Org, r.RunnerID)})
	if err != nil {
		return nil, err
	}
	s.log.Info("runner install started", "org", r.Org, "runner", r.RunnerID, "cluster", r.ClusterID, "namespace", in.Namespace)
	s.inst.start(r.Org, r.RunnerID)
	return &in, nil
}

// start runs the runner's install (or re-apply), or, when one runs, has it apply again
// once more (its generation moves on): an update started while an install or re-apply
// waits for its heartbeat re-applies with the update's version instead of recording
// INSTALLED for the version it applied before.
func (in *installer) start(org, runnerID string) {
	key := org + "/" + runnerID
	in.mu.Lock()
	defer in.mu.Unlock()
	in.gen[key]++
	if _, ok := in.running[key]; ok {
		return
	}
	ctx, cancel := context.WithCancel(in.base)
	in.running[key] = cancel
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		defer cancel()
		for {
			in.mu.Lock()
			g := in.gen[key]
			in.mu.Unlock()
			in.run(ctx, org, runnerID, g)
			in.mu.Lock()
			if in.gen[key] == g || ctx.Err() != nil {
				delete(in.running, key)
				in.mu.Unlock()
				return
			}
			in.mu.Unlock()
		}
	}()
}

// current says whether g is still the runner's install generation.
func (in *installer) current(org, runnerID string, g uint64) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.gen[org+"/"+runnerID] == g
}

// stop cancels the runner's install, if one runs.
func (in *installer) stop(org, runnerID string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if c, ok := in.running[org+"/"+runnerID]; ok {
		c()
	}
}

// target connects to the runner's cluster.
func (in *installer) target(ctx context.Context, org, clusterID string) (install.Target, error) {
	c, err := in.s.st.Clusters().Get(ctx, clusterID)
	if err != nil {
		return nil, err
	}
	if c.Org != org {
		return nil, fmt.Errorf("cluster %s is not the organization's", clusterID)
	}
	if in.s.sealer == nil {
		return nil, errors.New("this control plane keeps no cluster-credential key: it cannot open the cluster's credential")
	}
	cred, err := in.s.sealer.Open(c.ClusterID, c.Credential)
	if err != nil {
		return nil, err
	}
	rc, err := cred.RESTConfig()
	if err != nil {
		return nil, err
	}
	rc.Timeout = 30 * time.Second
	return in.cfg.NewTarget(rc)
}

// fail records why the install failed; the runner may be gone (deleted meanwhile).
func (in *installer) fail(ctx context.Context, rec store.Install, reason, msg string, hints []string) {
	rec.State, rec.Reason, rec.Message, rec.Hints = store.InstallFailed, reason, msg, hints
	// A fresh context: the install's may be what ran out.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return // stopped (the runner is being deleted, or the control plane stops)
	}
	if _, err := in.s.st.Installs().Put(wctx, rec); err != nil && !errors.Is(err, store.ErrNotFound) {
		in.s.log.Warn("cannot record the failed install", "runner", rec.RunnerID, "err", err)
	}
	in.s.log.Warn("runner install failed", "org", rec.Org, "runner", rec.RunnerID, "cluster", rec.ClusterID, "reason", reason, "err", msg)
}

// run applies the runner's objects for install generation g and waits for a heartbeat of
// the Pod it applied (heartbeatSince): for an update's re-apply, one received since the
// apply began, reporting the version the image was tagged with (the old Pod heartbeated
// before, and may heartbeat on until the new one replaces it). It
// records INSTALLED only while g is current; else it returns (start's loop applies again).
func (in *installer) run(ctx context.Context, org, runnerID string, g uint64) {
	rec, err := in.s.st.Installs().Get(ctx, org, runnerID)
	if err != nil {
		return // deleted meanwhile
	}
	if rec.State != store.InstallInstalling { // applying again after a failure, for a newer update
		rec.State, rec.Reason, rec.Message, rec.Hints = store.InstallInstalling, "", "", nil
		if rec, err = in.s.st.Installs().Put(ctx, rec); err != nil {
			return
		}
	}
	appliedAt := in.s.now().UTC().Truncate(time.Microsecond) // as the store keeps heartbeat times
	version, err := in.apply(ctx, rec)
	if err != nil {
		return
	}
	in.s.log.Info("runner objects applied; waiting for its heartbeat", "org", org, "runner", runnerID, "namespace", rec.Namespace, "version", version)
	deadline := time.NewTimer(in.cfg.HeartbeatTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		r, err := in.s.st.Runners().Get(ctx, org, runnerID)
		if errors.Is(err, store.ErrNotFound) || ctx.Err() != nil {
			return
		}
		if err == nil && heartbeatSince(r, appliedAt, version) {
			in.mu.Lock()
			if in.gen[org+"/"+runnerID] == g {
				rec.State, rec.Reason, rec.Message, rec.Hints = store.InstallInstalled, "", "", nil
				if _, err := in.s.st.Installs().Put(ctx, rec); err == nil {
					in.s.log.Info("runner installed: it heartbeats", "org", org, "runner", runnerID, "cluster", rec.ClusterID, "version", r.Status.Version)
				}
			}
			in.mu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			if !in.current(org, runnerID, g) {
				return // an update came meanwhile: applied again
			}
			msg := fmt.Sprintf("the runner's objects are applied but it did not heartbeat within %s", in.cfg.HeartbeatTimeout)
			if version != "" {
				msg = fmt.Sprintf("the runner's objects are applied (image version %s) but it did not heartbeat on that version within %s (it reports %q)",
					version, in.cfg.HeartbeatTimeout, r.Status.Version)
			}
			in.fail(ctx, rec, reasonNoHeartbeat, msg,
				[]string{
					fmt.Sprintf("look at the runner Pod in namespace %s of cluster %s (its events and logs)", rec.Namespace, rec.ClusterID),
					fmt.Sprintf("the cluster must reach the control plane at %s (--install-control-plane-url) and pull %s (--install-runner-image)",
						in.cfg.ControlPlaneAddress, runnerImage(in.cfg.RunnerImage, version)),
				})
			return
		case <-tick.C:
		}
	}
}

// heartbeatSince says whether runner r heartbeated on version (when not "": the version
// its image was tagged with) and, for a runner updated before (a re-apply: it heartbeated
// from its old Pod), at or after appliedAt. A first install's runner heartbeats only once
// its objects are applied.
func heartbeatSince(r store.Runner, appliedAt time.Time, version string) bool {
	hb := r.Status.LastHeartbeatAt
	return hb != nil && (version == "" || r.Status.Version == version) && (r.LastUpdate == nil || !hb.Before(appliedAt))
}

// apply applies the runner's objects, bounded by ApplyTimeout, and returns the version its
// image is tagged with ("": --install-runner-image as it is); on failure it records why.
func (in *installer) apply(ctx context.Context, rec store.Install) (string, error) {
	cfg := in.cfg
	if cfg.RunnerImage == "" || cfg.AgentImage == "" || cfg.ControlPlaneAddress == "" || in.s.ca == nil {
		err := errors.New("the control plane is not configured to install runners")
		in.fail(ctx, rec, reasonNotConfigured, err.Error(), []string{
			"start `sandboxd controlplane` with --install-runner-image, --install-agent-image and --install-control-plane-url (the address the cluster reaches the control plane at)"})
		return "", err
	}
	// The flag was checked at start (--install-runtime-classes); a runner given classes it
	// refuses would only crash-loop until CWSANDBOX_INSTALL_NO_HEARTBEAT.
	if err := install.CheckRuntimeClasses(cfg.RuntimeClasses); err != nil {
		in.fail(ctx, rec, reasonNotConfigured, "--install-runtime-classes: "+err.Error(), []string{
			"start `sandboxd controlplane` with --install-runtime-classes as the runner's --runtime-classes takes it (e.g. runc=,gvisor=gvisor), or without it (runc only)"})
		return "", err
	}
	// Checked at start too (--install-egress with --install-runner-arg).
	if err := install.CheckExtraArgs(cfg.Egress, cfg.ExtraArgs); err != nil {
		in.fail(ctx, rec, reasonNotConfigured, "--install-runner-arg: "+err.Error(), []string{
			"start `sandboxd controlplane` without --install-runner-arg values that set the egress flags --install-egress sets"})
		return "", err
	}
	actx, cancel := context.WithTimeout(ctx, cfg.ApplyTimeout)
	defer cancel()
	t, err := in.target(actx, rec.Org, rec.ClusterID)
	if err != nil {
		in.fail(ctx, rec, reasonCredential, err.Error(), []string{
			"the cluster's credential cannot be used: delete the cluster (after its runners) and add it again"})
		return "", err
	}
	secret, tok, err := NewBootstrapToken(in.s.ca.Certificate())
	if err != nil {
		in.fail(ctx, rec, reasonNotConfigured, err.Error(), nil)
		return "", err
	}
	// Valid as long as the install may wait for the runner, within the bootstrap maximum.
	ttl := min(cfg.ApplyTimeout+cfg.HeartbeatTimeout+time.Minute, MaxBootstrapTokenTTL)
	if err := in.s.st.BootstrapTokens().Create(actx, store.BootstrapToken{Hash: tok.Hash(), Org: rec.Org, RunnerID: rec.RunnerID,
		ExpiresAt: in.s.now().Add(ttl).UTC()}); err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			in.fail(ctx, rec, apierr.InstallFailed, err.Error(), nil)
		}
		return "", err
	}
	r, err := in.s.st.Runners().Get(actx, rec.Org, rec.RunnerID)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			in.fail(ctx, rec, apierr.InstallFailed, err.Error(), nil)
		}
		return "", err
	}
	version := runnerVersion(r)
	v := install.Values{
		Org: rec.Org, RunnerID: rec.RunnerID, Namespace: rec.Namespace, Image: runnerImage(cfg.RunnerImage, version), AgentImage: cfg.AgentImage,
		PullPolicy: corev1.PullPolicy(cfg.PullPolicy), SandboxImagePullPolicy: corev1.PullPolicy(cfg.SandboxPullPolicy),
		ControlPlane: cfg.ControlPlaneAddress, BootstrapToken: secret, CAPEM: string(in.s.ca.CertPEM()),
		BaseDomain: cfg.BaseDomain, StorageClass: cfg.StorageClass, ExtraArgs: cfg.ExtraArgs, PrepullImages: cfg.PrepullImages,
		RuntimeClasses: cfg.RuntimeClasses, Egress: cfg.Egress,
	}
	if err := install.Apply(actx, t, v); err != nil {
		d := install.Diagnose(err)
		in.fail(ctx, rec, d.Reason, err.Error(), d.Hints)
		return "", err
	}
	return version, nil
}

// UpdateStarting is called before runner r's update step writes its desired version
// (ApplyAvailableUpdate, the rollout's Config.Starting): for a runner the control plane
// installed, its install record goes INSTALLING first, so that no heartbeat hands the
// runner the new version before its objects are re-applied (Heartbeat), and a running
// install or re-apply no longer records INSTALLED for what it applied (its generation moves
// on). undo is to be called if the desired version was then not written: it puts the record
// back as it was (unless an install runs or another update came meanwhile).
func (s *Service) UpdateStarting(ctx context.Context, r store.Runner) (undo func(), err error) {
	in, err := s.st.Installs().Get(ctx, r.Org, r.RunnerID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return func() {}, nil
	case err != nil:
		return nil, fmt.Errorf("runner %s: read its install: %w", r.RunnerID, err)
	}
	key := r.Org + "/" + r.RunnerID
	s.inst.mu.Lock()
	s.inst.gen[key]++
	g := s.inst.gen[key]
	s.inst.mu.Unlock()
	if in.State == store.InstallInstalling {
		return func() {}, nil // its install runs (or is resumed at start) and applies again
	}
	prev := in
	in.State, in.Reason, in.Message, in.Hints = store.InstallInstalling, "", "", nil
	if _, err := s.st.Installs().Put(ctx, in); err != nil {
		return nil, fmt.Errorf("runner %s: record its re-apply: %w", r.RunnerID, err)
	}
	return func() {
		s.inst.mu.Lock()
		defer s.inst.mu.Unlock()
		if _, running := s.inst.running[key]; running || s.inst.gen[key] != g {
			return
		}
		if _, err := s.st.Installs().Put(context.WithoutCancel(ctx), prev); err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("cannot put back a runner's install record after its update did not start", "runner", r.RunnerID, "err", err)
		}
	}, nil
}

// UpdateStarted re-applies the objects of runner r, whose update step was just started (its
// desired_version written: ApplyAvailableUpdate, the rollout's Config.Started), with the
// current install settings: its install record goes INSTALLING (UpdateStarting did, before
// the desired version was written; the runner is told its desired version only once it is
// INSTALLED again) and the installer applies as at an install, with the runner image tagged
// with the desired version; the record goes INSTALLED once the runner heartbeats on that
// version after the apply. An install or re-apply that runs already applies again (its
// generation moved on). A self-managed runner (no install record) is left alone.
func (s *Service) UpdateStarted(ctx context.Context, r store.Runner) error {
	in, err := s.st.Installs().Get(ctx, r.Org, r.RunnerID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("runner %s: read its install: %w", r.RunnerID, err)
	}
	if in.State != store.InstallInstalling {
		in.State, in.Reason, in.Message, in.Hints = store.InstallInstalling, "", "", nil
		if _, err := s.st.Installs().Put(ctx, in); err != nil {
			return fmt.Errorf("runner %s: record its re-apply: %w", r.RunnerID, err)
		}
	}
	s.log.Info("runner update: re-applying its objects with the current install settings", "org", r.Org, "runner", r.RunnerID,
		"cluster", in.ClusterID, "version", r.DesiredVersion)
	s.inst.start(r.Org, r.RunnerID)
	return nil
}

// reapplyPending says whether runner r's install record (if any) is not INSTALLED: an
// install or an update's re-apply runs, or failed. Unknown (a store error) counts as
// pending: the runner then keeps its version.
func (s *Service) reapplyPending(ctx context.Context, r store.Runner) bool {
	in, err := s.st.Installs().Get(ctx, r.Org, r.RunnerID)
	if errors.Is(err, store.ErrNotFound) {
		return false
	}
	if err != nil {
		s.log.Warn("cannot read a runner's install: its desired version is held back", "runner", r.RunnerID, "err", err)
		return true
	}
	return in.State != store.InstallInstalled
}

// runnerVersion is the version runner r's image is to be tagged with (as the runner's own
// self-update tags its image): its desired version (the update being re-applied), else, for
// a runner whose last update succeeded to the version it reports (so that version is an
// image tag), that version (a re-apply resumed after its step ended must not move it back
// to --install-runner-image's tag); else "" (--install-runner-image as it is: an install,
// or a runner whose reported version is not known to be a tag, e.g. after a failed update).
func runnerVersion(r store.Runner) string {
	if r.DesiredVersion != "" {
		return r.DesiredVersion
	}
	if lu := r.LastUpdate; lu != nil && lu.State == store.UpdateSucceeded && lu.To == r.Status.Version {
		return r.Status.Version
	}
	return ""
}

// runnerImage is ref (--install-runner-image) tagged with version (runnerVersion), or ref
// as it is when version is "".
func runnerImage(ref, version string) string {
	if version == "" {
		return ref
	}
	return release.ImageWithTag(ref, version)
}

// uninstall removes what the control plane installed for r: its namespace, with
// everything in it, and its cluster-scoped image pre-pull ClusterRole and
// ClusterRoleBinding (install.NodesRoleName). The namespace's deletion finishes in the
// cluster after this returns. A namespace or cluster-scoped object that does not carry the
// runner's labels (install.Owned) is never deleted: if the install failed on exactly that
// (it found it someone else's and applied nothing over it), the uninstall succeeds once the
// runner's own objects are gone; otherwise it fails (UninstallFailed: the runner stays
// unless deleted with force), so the change of labels is noticed rather than the object
// silently left or wrongly deleted.
func (s *Service) uninstall(ctx context.Context, in store.Install) error {
	s.inst.stop(in.Org, in.RunnerID)
	ctx, cancel := context.WithTimeout(ctx, s.inst.cfg.ApplyTimeout)
	defer cancel()
	t, err := s.inst.target(ctx, in.Org, in.ClusterID)
	if err != nil {
		return err
	}
	err = install.Remove(ctx, t, in.Org, in.RunnerID, in.Namespace)
	var fe *install.ForeignNamespaceError
	if errors.As(err, &fe) && in.State == store.InstallFailed && strings.HasPrefix(in.Message, install.ForeignPrefix) {
		s.log.Warn("runner uninstall: its namespace is not this control plane's; left alone (the install created nothing)",
			"org", in.Org, "runner", in.RunnerID, "cluster", in.ClusterID, "namespace", in.Namespace)
		return nil
	}
	var fo *install.ForeignObjectError
	if errors.As(err, &fo) && in.State == store.InstallFailed && strings.HasPrefix(in.Message, install.ForeignObjectPrefix) {
		s.log.Warn("runner uninstall: a cluster-scoped object of its name is not this control plane's; left alone (the install did not apply over it)",
			"org", in.Org, "runner", in.RunnerID, "cluster", in.ClusterID, "kind", fo.Kind, "name", fo.Name)
		return nil
	}
	if errors.As(err, &fe) {
		s.log.Warn("runner uninstall refused: its namespace does not carry the runner's labels", "org", in.Org, "runner", in.RunnerID,
			"cluster", in.ClusterID, "namespace", in.Namespace, "err", err)
	}
	if errors.As(err, &fo) {
		s.log.Warn("runner uninstall: a cluster-scoped object of its name does not carry the runner's labels; left alone", "org", in.Org,
			"runner", in.RunnerID, "cluster", in.ClusterID, "kind", fo.Kind, "name", fo.Name, "err", err)
	}
	if err != nil && in.State == store.InstallFailed &&
		(strings.HasPrefix(in.Message, namespaceApplyFailed) || strings.HasPrefix(in.Message, namespaceGetFailed)) {
		// The install failed creating the namespace: nothing of it is in the cluster, and
		// a credential that could not create the namespace cannot delete it either.
		return nil
	}
	if err != nil && in.State == store.InstallFailed && strings.HasPrefix(in.Message, clusterObjectGetFailed) &&
		strings.HasPrefix(err.Error(), clusterObjectGetFailed) {
		// The install failed reading its ClusterRole (or Binding) to check whose it is,
		// before creating anything; Remove has deleted the namespace (if any) before it
		// failed the same way, so nothing of the runner is left that the credential can see.
		return nil
	}
	return err
}

// clusterObjectGetFailed starts the message of an install that could not read its
// cluster-scoped ClusterRole or ClusterRoleBinding (checked before anything is created).
const clusterObjectGetFailed = "get ClusterRole"

// namespaceApplyFailed starts the message of an install that failed applying its namespace
// (install.ApplyError's text): it created nothing.
const namespaceApplyFailed = "apply Namespace "

// namespaceGetFailed starts the message of an install that could not even read its
// namespace (to check whose it is): it created nothing either.
const namespaceGetFailed = "get Namespace "

// installStatus fills st's install fields from the runner's install record (none:
// self-managed). An INSTALLING runner that has heartbeated shows INSTALLED even before
// its install goroutine records it, if it was never updated (heartbeated: a first install;
// an update's re-apply is INSTALLED only once recorded, as the old Pod's heartbeats say
// nothing of the new one).
func installStatus(st *controlplanev1.ManagedRunnerStatus, in *store.Install, heartbeated bool) {
	if in == nil {
		st.InstallStatus = controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_SELF_MANAGED
		return
	}
	st.InstallNamespace = in.Namespace
	switch in.State {
	case store.InstallInstalled:
		st.InstallStatus = controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED
	case store.InstallFailed:
		st.InstallStatus = controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_FAILED
		st.InstallError = &controlplanev1.RunnerInstallError{Reason: in.Reason, Message: in.Message, Hints: in.Hints}
	default:
		st.InstallStatus = controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLING
		if heartbeated {
			st.InstallStatus = controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED
		}
	}
}

// withInstall sets out's install status from the store.
func (s *Service) withInstall(ctx context.Context, out *controlplanev1.ManagedRunner, org string) *controlplanev1.ManagedRunner {
	in, err := s.st.Installs().Get(ctx, org, out.GetRunnerId())
	switch {
	case err == nil:
		installStatus(out.Status, &in, out.GetStatus().GetLastHeartbeatTime() != nil && out.GetStatus().GetLastUpdateResult() == nil)
	case !errors.Is(err, store.ErrNotFound):
		s.log.Warn("cannot read a runner's install", "runner", out.GetRunnerId(), "err", err)
	}
	return out
}

func uninstallErr(runnerID string, in store.Install, err error) error {
	d := install.Diagnose(err)
	return apierr.New(apierr.UninstallFailed,
		fmt.Sprintf("runner %s: cannot remove namespace %s from cluster %s (%s): %v; hints: %s; or delete with force (the objects stay in the cluster)",
			runnerID, in.Namespace, in.ClusterID, d.Reason, err, strings.Join(d.Hints, "; ")),
		map[string]string{"runner_id": runnerID, "cluster_id": in.ClusterID, "namespace": in.Namespace, "install_reason": d.Reason})
}
