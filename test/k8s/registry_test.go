package k8s

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestPlatformRegistryPull (issue 22: "Kubernetes runners too"): a gateway serves the
// platform registry at /v2/ of its API port (as `sandboxd gateway --registry`), on the
// node's loopback over plain HTTP; the cluster's containerd reaches it through a
// hosts.toml in up.sh's certs.d (`server = "http://…"`: what an operator configures for a
// registry without TLS). An image is pushed to org-a's repository with a push token, and
//   - pre-pull (issue 22 §5): the runner is sent a warm target of org-a naming it (as the
//     gateway sends every template the runner may place), with org-a's pull token: the
//     image is on the node (containerd's image list) before any sandbox of it exists, and
//     the pre-pull Pod that pulled it is gone;
//   - org-a's sandbox naming it by digest, without a command, runs on the Kubernetes
//     runner (--platform-registry: the runner reads the entrypoint from the registry with
//     the token the gateway minted): RUNNING, exec sees the image's env; its Pod names
//     org-a's pull Secret (sbx-org-…: a dockerconfigjson with a pull token of org-a for
//     the registry host) and pulls Always; a second org-a sandbox names the same Secret,
//     an org-b sandbox (of the image pushed to org-b's repository) another one, holding
//     org-b's token; each organization's Secret goes with its last sandbox (and, for
//     org-a, once no pre-pull wants it);
//   - org-b's sandbox naming the same digest fails ImagePullFailed, with a command (the
//     kubelet is refused by the registry: another organization's repository is
//     NAME_UNKNOWN to org-b's token, although the node holds the image since org-a's
//     sandbox pulled it) and without one (the runner's config read is refused first).
func TestPlatformRegistryPull(t *testing.T) {
	c := needCluster(t)
	certs := filepath.Join(env("SANDBOXD_K8S_DIR", "/var/lib/sandboxd-k8s"), "containerd", "certs.d")
	if _, err := os.Stat(certs); err != nil {
		msg := "the cluster's containerd has no registry config dir " + certs + " (brought up by an older up.sh): run test/k8s/down.sh and up.sh"
		if os.Getenv("SANDBOXD_K8S_REQUIRED") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	busyboxTar := filepath.Join(testimage.Dir(), "busybox.tar")
	if _, err := os.Stat(busyboxTar); errors.Is(err, os.ErrNotExist) {
		t.Skip(testimage.ErrNoTestImages)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	// The gateway's port, and with it the registry's host, first.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := ln.Addr().String()
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	keyA, _, _ := keys.Create("org-a", auth.RoleUser, "")
	keyB, _, _ := keys.Create("org-b", auth.RoleUser, "")
	tokenKey := make([]byte, 32)
	_, _ = rand.Read(tokenKey)
	reg, err := registry.New(ctx, registry.Config{Dir: t.TempDir(), Auth: keys, TokenKey: tokenKey, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)

	// containerd pulls from it over plain HTTP; the entry goes with the test.
	hostDir := filepath.Join(certs, host)
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(hostDir) })
	toml := "server = \"http://" + host + "\"\n\n[host.\"http://" + host + "\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	if err := os.WriteFile(filepath.Join(hostDir, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}

	// The Kubernetes runner as the chart runs it with platformRegistry.host/plainHTTP set:
	// --platform-registry HOST --insecure-registry HOST, the default pull policy.
	runnerID := randomID("test-")
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	s, err := stack.NewKubernetes(sctx, stack.KubernetesConfig{Kubeconfig: c.kubeconfig, DataDir: t.TempDir(),
		Backend: &kubernetes.Config{Namespace: c.namespace, RunnerID: runnerID, AgentImage: c.agentImage,
			ImagePullPolicy: corev1.PullIfNotPresent, TerminationGrace: 5 * time.Second,
			PlatformRegistry: host, PlatformRegistryHTTP: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); deleteRunnerObjects(s.Client, c.namespace, runnerID) })

	g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal(runnerID, s.Runner)},
		RegistryCredentials: reg.PullCredentials})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	mux := http.NewServeMux()
	mux.Handle("/v2/", reg)
	mux.Handle("/", g.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: p}}
	apiFor := func(key string) sandboxv1connect.SandboxServiceClient {
		return sandboxv1connect.NewSandboxServiceClient(hc, "http://"+host, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))
	}
	apiA, apiB := apiFor(keyA), apiFor(keyB)

	// The image: busybox with a command and an env of its own (a nonce: a digest no run
	// before pulled onto the node), pushed to org-a's repository with a push token.
	nonce := randomID("")
	img, err := testimage.Build(busyboxTar, image.Config{
		Cmd: []string{"/bin/sh", "-c", `trap "exit 0" TERM; sleep 3600 & wait`},
		Env: []string{testimage.DefaultPath, "SBX_REGISTRY_TEST=" + nonce}})
	if err != nil {
		t.Fatal(err)
	}
	push, err := reg.MintPushToken("org-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tagged, _ := name.ParseReference(host+"/org-a/app:v1", name.Insecure)
	if err := remote.Write(tagged, img, remote.WithAuth(&authn.Basic{Username: "sandboxd", Password: push}), remote.WithContext(ctx)); err != nil {
		t.Fatalf("push: %v", err)
	}
	d, _ := img.Digest()
	ref := host + "/org-a/app@" + d.String()
	res := &sandboxv1.Resources{Cpu: "100m", Memory: "32Mi"}

	sock := filepath.Join(env("SANDBOXD_K8S_DIR", "/var/lib/sandboxd-k8s"), "run", "containerd.sock")
	nodeHolds := func(ref string) (bool, error) {
		out, err := osexec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "images", "ls", "-q").Output()
		return strings.Contains(string(out), ref), err
	}
	pods, secrets := s.Client.CoreV1().Pods(c.namespace), s.Client.CoreV1().Secrets(c.namespace)

	// Pre-pull: a warm target of org-a (a template without a warm pool) puts the image
	// onto the node before any sandbox of it.
	if held, err := nodeHolds(ref); err != nil {
		t.Fatalf("ctr images ls: %v", err)
	} else if held {
		t.Fatalf("the node holds %s before the test pulled it", ref)
	}
	u, pw, ok := reg.PullCredentials("org-a", ref)
	if !ok {
		t.Fatal("no pull credentials for", ref)
	}
	local := runner.NewLocal(runnerID, s.Runner)
	warm := []runtime.WarmTarget{{Key: "org-a/tmpl-1", Spec: runtime.Spec{
		Container: runtime.Container{Image: ref, PullCredentials: &runtime.Credentials{Username: u, Password: pw}},
		Meta:      map[string]string{runtime.MetaOrg: "org-a"}}}}
	start := time.Now()
	if err := local.SetWarmPools(ctx, warm); err != nil {
		t.Fatal(err)
	}
	prepullSel := metav1.ListOptions{LabelSelector: kubernetes.LabelKind + "=" + kubernetes.KindPrepull + "," + kubernetes.LabelRunner + "=" + runnerID}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		held, _ := nodeHolds(ref)
		l, err := pods.List(ctx, prepullSel)
		if held && err == nil && len(l.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pre-pull: node holds %s: %v; pre-pull pods %d (%v); status %+v", ref, held, len(l.Items), err, s.Backend.PrepullStatus())
		}
	}
	t.Logf("pre-pulled %s onto the node %v after the warm target (status %+v)", ref, time.Since(start).Round(time.Millisecond), s.Backend.PrepullStatus())
	// What the runner's heartbeat reports of it (ManagedRunnerStatus.prepull).
	if rep, ok := local.PrepullReport(); !ok || len(rep.Images) != 1 || rep.Images[0].Image != ref || rep.Images[0].Target != "org-a/tmpl-1" ||
		rep.Images[0].State != runtime.PrepullPresent || rep.Images[0].NodesTotal < 1 || rep.Images[0].NodesPresent != rep.Images[0].NodesTotal ||
		rep.Images[0].LastError != "" || rep.Images[0].LastAttempt.IsZero() || rep.Images[0].NextAttempt.IsZero() {
		t.Errorf("pre-pull report after the pre-pull: %+v (%v)", rep, ok)
	}
	if l, _ := pods.List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelSandbox + "," + kubernetes.LabelRunner + "=" + runnerID}); len(l.Items) != 0 {
		t.Errorf("%d sandbox pods before any create", len(l.Items))
	}
	orgA, orgB := kubernetes.OrgPullSecretName(runnerID, "org-a"), kubernetes.OrgPullSecretName(runnerID, "org-b")
	if _, err := secrets.Get(ctx, orgA, metav1.GetOptions{}); err != nil {
		t.Errorf("org-a's pull secret after the pre-pull: %v", err)
	}

	// org-a: runs, with the image's own command.
	start = time.Now()
	id := createRunningSpec(t, ctx, apiA, &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: ref, Resources: res}}})
	t.Logf("org-a's sandbox %s RUNNING %v after create (%s pre-pulled)", id, time.Since(start).Round(time.Millisecond), ref)
	if got := strings.TrimSpace(execOK(t, ctx, apiA, id, "/bin/sh", "-c", "echo $SBX_REGISTRY_TEST")); got != nonce {
		t.Errorf("exec echo $SBX_REGISTRY_TEST: %q, want the image's %q", got, nonce)
	}
	pullSecretsOf := func(id string) []string {
		t.Helper()
		pod, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range pod.Spec.ImagePullSecrets {
			out = append(out, r.Name)
		}
		return out
	}
	pod, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pull := orgA
	if got := pullSecretsOf(id); len(got) != 1 || got[0] != orgA {
		t.Errorf("imagePullSecrets %v, want [%s] (org-a's)", got, orgA)
	}
	if _, err := secrets.Get(ctx, "sbx-"+id+"-pull", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a per-sandbox pull secret besides org-a's: %v", err)
	}
	for _, ct := range pod.Spec.Containers {
		if ct.Image == ref && ct.ImagePullPolicy != corev1.PullAlways {
			t.Errorf("container %s: imagePullPolicy %s, want Always", ct.Name, ct.ImagePullPolicy)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Image == ref || strings.HasPrefix(cs.Image, host+"/") {
			if !strings.HasSuffix(cs.ImageID, d.String()) {
				t.Errorf("container %s runs image ID %s, want digest %s", cs.Name, cs.ImageID, d)
			}
		}
	}
	tokenIn := func(name, org string) string {
		t.Helper()
		sec, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var dc struct {
			Auths map[string]struct{ Username, Password string }
		}
		if err := json.Unmarshal(sec.Data[corev1.DockerConfigJsonKey], &dc); err != nil || sec.Type != corev1.SecretTypeDockerConfigJson || len(dc.Auths) != 1 {
			t.Fatalf("pull secret %s: type %s, %d auths (%v)", name, sec.Type, len(dc.Auths), err)
		}
		if sec.Annotations[kubernetes.AnnotationOrg] != org {
			t.Errorf("pull secret %s is for organization %q, want %q", name, sec.Annotations[kubernetes.AnnotationOrg], org)
		}
		return dc.Auths[host].Password
	}
	tok := tokenIn(pull, "org-a")
	// The Secret's token is a pull token of org-a: it reads org-a's image, pushes nothing.
	if _, err := remote.Head(tagged, remote.WithAuth(&authn.Basic{Username: "sandboxd", Password: tok}), remote.WithContext(ctx)); err != nil {
		t.Errorf("the pull secret's token does not read org-a's image: %v", err)
	}
	if !strings.HasPrefix(tok, "sbxreg.") {
		t.Errorf("the pull secret holds %.10q…, want a platform pull token", tok)
	}
	other, _ := name.ParseReference(host+"/org-a/other:v1", name.Insecure)
	if err := remote.Write(other, img, remote.WithAuth(&authn.Basic{Username: "sandboxd", Password: tok}), remote.WithContext(ctx)); err == nil {
		t.Error("the pull secret's token pushed")
	}

	// A second org-a sandbox shares org-a's Secret; org-b's sandbox (the image pushed to
	// org-b's repository) has its own, with org-b's token.
	id2 := createRunningSpec(t, ctx, apiA, &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: ref, Resources: res}}})
	if got := pullSecretsOf(id2); len(got) != 1 || got[0] != orgA {
		t.Errorf("second org-a sandbox: imagePullSecrets %v, want [%s]", got, orgA)
	}
	pushB, err := reg.MintPushToken("org-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	taggedB, _ := name.ParseReference(host+"/org-b/app:v1", name.Insecure)
	if err := remote.Write(taggedB, img, remote.WithAuth(&authn.Basic{Username: "sandboxd", Password: pushB}), remote.WithContext(ctx)); err != nil {
		t.Fatalf("push to org-b: %v", err)
	}
	refB := host + "/org-b/app@" + d.String()
	idB := createRunningSpec(t, ctx, apiB, &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: refB, Resources: res}}})
	if got := pullSecretsOf(idB); len(got) != 1 || got[0] != orgB || orgB == orgA {
		t.Errorf("org-b's sandbox: imagePullSecrets %v, want [%s] (not org-a's %s)", got, orgB, orgA)
	}
	tokB := tokenIn(orgB, "org-b")
	if tokB == tok || tokB == "" {
		t.Error("org-b's secret holds org-a's token")
	}
	if _, err := remote.Head(tagged, remote.WithAuth(&authn.Basic{Username: "sandboxd", Password: tokB}), remote.WithContext(ctx)); err == nil {
		t.Error("org-b's secret's token reads org-a's image")
	}
	t.Logf("pull secrets: org-a %s (sandboxes %s, %s), org-b %s (sandbox %s)", orgA, id, id2, orgB, idB)

	// org-b, with a command: the kubelet asks the registry (Always), which refuses org-b's
	// token for org-a's repository; the node's copy of the image does not run.
	if out, err := osexec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "images", "ls", "-q").Output(); err != nil {
		t.Logf("ctr images ls: %v (not checked that the node holds the image)", err)
	} else if !strings.Contains(string(out), ref) {
		t.Errorf("the node does not hold %s after org-a's sandbox ran it:\n%s", ref, out)
	}
	failed := func(api sandboxv1connect.SandboxServiceClient, ctr *sandboxv1.Container) *sandboxv1.SandboxStatus {
		t.Helper()
		cr, err := api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{ctr}}}}))
		if err != nil {
			return &sandboxv1.SandboxStatus{StateReason: "refused at create: " + err.Error()}
		}
		bid := cr.Msg.GetSandboxId()
		for {
			gr, err := api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: bid}))
			if err != nil {
				t.Fatalf("get %s: %v", bid, err)
			}
			st := gr.Msg.GetStatus()
			switch st.GetState() {
			case sandboxv1.State_STATE_FAILED, sandboxv1.State_STATE_COMPLETED, sandboxv1.State_STATE_TERMINATED:
				return st
			case sandboxv1.State_STATE_RUNNING:
				out, err := api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: bid, Command: []string{"/bin/sh", "-c", "echo $SBX_REGISTRY_TEST"}}))
				if err == nil {
					t.Fatalf("org-b's sandbox %s runs org-a's image (its env: %q)", bid, out.Msg.GetStdout())
				}
				t.Fatalf("org-b's sandbox %s runs org-a's image (exec: %v)", bid, err)
			}
			if ctx.Err() != nil {
				t.Fatalf("org-b's sandbox %s: %v, want FAILED", bid, st)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	st := failed(apiB, &sandboxv1.Container{Name: "main", Image: ref, Command: "sleep", Args: []string{"3600"}, Resources: res})
	t.Logf("org-b with a command: %s %s", st.GetState(), st.GetStateReason())
	if st.GetState() != sandboxv1.State_STATE_FAILED || !strings.HasPrefix(st.GetStateReason(), runner.ReasonImagePullFailed) {
		t.Errorf("org-b's sandbox naming org-a's image (command given): %s %q, want FAILED %s", st.GetState(), st.GetStateReason(), runner.ReasonImagePullFailed)
	}
	st = failed(apiB, &sandboxv1.Container{Name: "main", Image: ref, Resources: res})
	t.Logf("org-b without a command: %s %s", st.GetState(), st.GetStateReason())
	if st.GetState() != sandboxv1.State_STATE_FAILED || !strings.HasPrefix(st.GetStateReason(), runner.ReasonImagePullFailed) {
		t.Errorf("org-b's sandbox naming org-a's image (no command): %s %q, want FAILED %s", st.GetState(), st.GetStateReason(), runner.ReasonImagePullFailed)
	}

	// Each organization's Secret goes with its last sandbox (org-a's once the pre-pull no
	// longer wants it either).
	gone := func(name string) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			_, err := secrets.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pull secret %s still there (err %v)", name, err)
			}
		}
	}
	del := func(api sandboxv1connect.SandboxServiceClient, id string) {
		t.Helper()
		if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if _, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod of %s still there after delete", id)
			}
		}
	}
	del(apiB, idB)
	gone(orgB)
	del(apiA, id)
	if _, err := secrets.Get(ctx, orgA, metav1.GetOptions{}); err != nil {
		t.Errorf("org-a's secret gone with a sandbox of org-a left: %v", err)
	}
	del(apiA, id2)
	time.Sleep(time.Second)
	if _, err := secrets.Get(ctx, orgA, metav1.GetOptions{}); err != nil {
		t.Errorf("org-a's secret gone while the pre-pull wants it: %v", err)
	}
	if err := local.SetWarmPools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	gone(orgA)
}
