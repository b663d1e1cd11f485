package k8s

import (
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
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

	root, err := admin.CoreV1().ConfigMaps(c.namespace).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterID := "test-" + runnerID
	if _, err := cp.clusters.AddCluster(ctx, connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &controlplanev1.Cluster{
		ClusterId: clusterID, Server: "https://" + net.JoinHostPort(host, "6443"), Token: rc.BearerToken, CaPem: root.Data["ca.crt"]}})); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	if err := os.Chown(dataDir, 65532, 65532); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: class},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              class,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dataDir}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: install.ReleaseName},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = admin.CoreV1().Namespaces().Delete(bg, ns, metav1.DeleteOptions{})
		_ = admin.CoreV1().PersistentVolumes().Delete(bg, class, metav1.DeleteOptions{})
	})
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
