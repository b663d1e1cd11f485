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
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestPlatformRegistryPull (issue 22: "Kubernetes runners too"): a gateway serves the
// platform registry at /v2/ of its API port (as `sandboxd gateway --registry`), on the
// node's loopback over plain HTTP; the cluster's containerd reaches it through a
// hosts.toml in up.sh's certs.d (`server = "http://…"`: what an operator configures for a
// registry without TLS). An image is pushed to org-a's repository with a push token, and
//   - org-a's sandbox naming it by digest, without a command, runs on the Kubernetes
//     runner (--platform-registry: the runner reads the entrypoint from the registry with
//     the token the gateway minted): RUNNING, exec sees the image's env; its Pod names
//     the sandbox's own pull Secret (a dockerconfigjson with a pull token of org-a for the
//     registry host) and pulls Always; the Secret goes with the sandbox;
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

	// org-a: runs, with the image's own command.
	start := time.Now()
	id := createRunningSpec(t, ctx, apiA, &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: ref, Resources: res}}})
	t.Logf("org-a's sandbox %s RUNNING %v after create (first pull of %s)", id, time.Since(start).Round(time.Millisecond), ref)
	if got := strings.TrimSpace(execOK(t, ctx, apiA, id, "/bin/sh", "-c", "echo $SBX_REGISTRY_TEST")); got != nonce {
		t.Errorf("exec echo $SBX_REGISTRY_TEST: %q, want the image's %q", got, nonce)
	}
	pods, secrets := s.Client.CoreV1().Pods(c.namespace), s.Client.CoreV1().Secrets(c.namespace)
	pod, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pull := "sbx-" + id + "-pull"
	if len(pod.Spec.ImagePullSecrets) != 1 || pod.Spec.ImagePullSecrets[0].Name != pull {
		t.Errorf("imagePullSecrets %v, want [%s]", pod.Spec.ImagePullSecrets, pull)
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
	sec, err := secrets.Get(ctx, pull, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var dc struct {
		Auths map[string]struct{ Username, Password string }
	}
	if err := json.Unmarshal(sec.Data[corev1.DockerConfigJsonKey], &dc); err != nil || sec.Type != corev1.SecretTypeDockerConfigJson || len(dc.Auths) != 1 {
		t.Fatalf("pull secret %s: type %s, %d auths (%v)", pull, sec.Type, len(dc.Auths), err)
	}
	tok := dc.Auths[host].Password
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

	// org-b, with a command: the kubelet asks the registry (Always), which refuses org-b's
	// token for org-a's repository; the node's copy of the image does not run.
	sock := filepath.Join(env("SANDBOXD_K8S_DIR", "/var/lib/sandboxd-k8s"), "run", "containerd.sock")
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

	// org-a's Secret goes with its sandbox.
	if _, err := apiA.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		_, err := secrets.Get(ctx, pull, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pull secret %s still there after delete (err %v)", pull, err)
		}
	}
}
