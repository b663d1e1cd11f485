package k8s

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestInstalledRunnerReapply: install settings reach an installed runner at its next
// update. A runner installed without egress; the control plane restarted (same store, CA
// and address: the runner heartbeats on) with
// --install-egress (InstallConfig.Egress) and a channel offering update-test: nothing
// changes in the cluster until :applyAvailableUpdate, which re-applies the runner's objects:
// the egress Service and NetworkPolicy appear, the runner's args carry the --egress-*
// flags and its image the update's tag, and the runner comes back on that version
// (INSTALLED). Restarted again with egress off and the channel back on dev: the next
// update deletes both objects and drops the args.
func TestInstalledRunnerReapply(t *testing.T) {
	c := needCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	runnerImage := env("SANDBOXD_K8S_RUNNER_IMAGE", "localhost/sandboxd/runner:dev")
	const target = "update-test" // up.sh builds the runner image as this version too
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := k8s.NewForConfigOrDie(rc)
	host := nodeIP(t, ctx, admin)
	runnerID := randomID("reapply-")
	ns := install.Namespace("platform", runnerID)
	class := "sandboxd-" + runnerID
	cfg := controlplane.InstallConfig{
		RunnerImage: runnerImage, AgentImage: c.agentImage, PullPolicy: "Never", SandboxPullPolicy: "Never",
		StorageClass: class, ExtraArgs: []string{"--heartbeat-interval=300ms"},
		ApplyTimeout: time.Minute, HeartbeatTimeout: 3 * time.Minute,
	}
	dir := t.TempDir()
	cp := startInstallPlaneIn(t, ctx, dir, net.JoinHostPort(host, "0"), cfg, nil)

	clusterID, _, _ := installTarget(t, ctx, c, cp, admin, rc.BearerToken, host, runnerID, ns, class)
	if _, err := cp.runners.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: runnerID, ClusterId: clusterID, Zone: "test", ReleaseChannel: controlplanev1.ReleaseChannel_STABLE, Policy: &structpb.Struct{}}})); err != nil {
		t.Fatal(err)
	}
	waitInstallStatus(t, ctx, cp, runnerID, admin, ns, controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED)
	checkEgressInstalled(t, ctx, admin, ns, false)
	deploy, err := admin.AppsV1().Deployments(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	generation := deploy.Generation

	// Restarted with --install-egress: nothing is applied until the update. (The install
	// records INSTALLED at its next look after the heartbeat: a restart before would resume
	// it, with the new flags.)
	cp.waitInstalls()
	cp.stop()
	on := cfg
	on.Egress = true
	cp = startInstallPlaneIn(t, ctx, dir, cp.addr, on, map[string]string{store.ChannelStable: target})
	time.Sleep(2 * time.Second) // what a re-apply at start would need to show
	if d, err := admin.AppsV1().Deployments(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{}); err != nil || d.Generation != generation {
		t.Fatalf("a restart with --install-egress changed the Deployment before any update: %v", err)
	}
	checkEgressInstalled(t, ctx, admin, ns, false)
	updateAndWait(t, ctx, cp, admin, ns, runnerID, target)
	checkEgressInstalled(t, ctx, admin, ns, true)
	if d, err := admin.AppsV1().Deployments(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{}); err != nil ||
		d.Spec.Template.Spec.Containers[0].Image != stack.WithTag(runnerImage, target) {
		t.Fatalf("runner image after the update: %v", err)
	}

	// Off again, back to dev: the update deletes the egress objects and drops the args.
	cp.waitInstalls()
	cp.stop()
	cp = startInstallPlaneIn(t, ctx, dir, cp.addr, cfg, map[string]string{store.ChannelStable: "dev"})
	updateAndWait(t, ctx, cp, admin, ns, runnerID, "dev")
	checkEgressInstalled(t, ctx, admin, ns, false)

	if _, err := cp.runners.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: runnerID})); err != nil {
		t.Fatal(err)
	}
}

// updateAndWait applies runner id's available update and waits until it heartbeats
// version, INSTALLED (its objects re-applied).
func updateAndWait(t *testing.T, ctx context.Context, cp *installPlane, admin k8s.Interface, ns, id, version string) {
	t.Helper()
	start := time.Now()
	if _, err := cp.runners.ApplyAvailableUpdate(ctx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: id})); err != nil {
		t.Fatalf("applyAvailableUpdate to %s: %v", version, err)
	}
	for {
		st := waitInstallStatus(t, ctx, cp, id, admin, ns, controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_INSTALLED)
		if st.GetVersion() == version {
			t.Logf("runner %s on %s (objects re-applied) %s after :applyAvailableUpdate", id, version, time.Since(start).Round(time.Millisecond))
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("runner %s reports %q, want %q", id, st.GetVersion(), version)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkEgressInstalled checks that the runner's egress Service and NetworkPolicy exist and
// its Deployment's args carry the four --egress-* flags (on), or that none of it is there.
func checkEgressInstalled(t *testing.T, ctx context.Context, admin k8s.Interface, ns string, on bool) {
	t.Helper()
	_, serr := admin.CoreV1().Services(ns).Get(ctx, install.EgressName, metav1.GetOptions{})
	_, nerr := admin.NetworkingV1().NetworkPolicies(ns).Get(ctx, install.EgressName, metav1.GetOptions{})
	d, err := admin.AppsV1().Deployments(ns).Get(ctx, install.ReleaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var egress []string
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--egress-") {
			egress = append(egress, strings.SplitN(a, "=", 2)[0])
		}
	}
	if on {
		if serr != nil || nerr != nil || !slices.Equal(egress, install.EgressFlags) {
			t.Fatalf("egress on: Service %v, NetworkPolicy %v, args %v", serr, nerr, egress)
		}
		return
	}
	if !apierrors.IsNotFound(serr) || !apierrors.IsNotFound(nerr) || egress != nil {
		t.Fatalf("egress off: Service %v, NetworkPolicy %v, args %v (want none)", serr, nerr, egress)
	}
}
