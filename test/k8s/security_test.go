package k8s

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestSecurityVolumesRemote: through a gateway that reaches the Kubernetes runner over
// the runner wire (RunnerService, mTLS; the runner is unregistered, with no policy of
// its own), a sandbox with run_as_user 1000, a read-only root, drop ALL, scratch volumes
// of both media (one mounted twice, read-only with a sub_path) and a same_user egress
// rule: the Pod carries the security context, the emptyDirs with their sizes, the
// policy's pod fragment (it crossed the wire) and the caller label its NetworkPolicy
// selects on; inside, commands run as 1000 without capabilities, / is read-only, /tmp
// and the volumes are writable, and exec, files and logs work.
func TestSecurityVolumesRemote(t *testing.T) {
	c, s, runnerID := setup(t)
	ctx := context.Background()

	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := runnerapi.ServerTLSConfig(ca, runnerID, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := runnerapi.NewServer(runnerID, s.Runner, nil).HTTPServer(scfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	ccfg, err := runnerapi.ClientTLSConfig(ca, "gw1", runnerID)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: runnerID, Addr: ln.Addr().String(), TLS: ccfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	doc := `{"base": {"pod": {"annotations": {"example.com/via": "wire"},
		"tolerations": [{"key": "sandboxd.io/dedicated", "operator": "Exists", "effect": "NoSchedule"}]}}}`
	_, api, _ := serveGateway(t, gateway.Config{Runners: []runner.Handle{rc}, Policies: policyMap{runnerID: doc}})

	sp := &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh",
			Args:      []string{"-c", `echo started as $(id -u); trap "exit 0" TERM; sleep 3600 & wait`},
			Resources: &sandboxv1.Resources{Cpu: "250m", Memory: "128Mi"},
			SecurityContext: &sandboxv1.SecurityContext{
				RunAsUser: proto.Uint32(1000), ReadOnlyRootFilesystem: proto.Bool(true),
				CapabilitiesDrop: []string{"ALL"}, AllowPrivilegeEscalation: proto.Bool(false), SeccompProfile: "RuntimeDefault",
			},
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "disk", MountPath: "/data"}, {Volume: "disk", MountPath: "/view", SubPath: "sub", ReadOnly: true},
				{Volume: "mem", MountPath: "/mem"}},
		}},
		Volumes: []*sandboxv1.SandboxVolume{
			{Name: "disk", Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{Size: "64Mi", Medium: sandboxv1.StorageMedium_STORAGE_MEDIUM_DISK}}},
			{Name: "mem", Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{Size: "32Mi", Medium: sandboxv1.StorageMedium_STORAGE_MEDIUM_MEMORY}}},
		},
		Network: &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_Tenant{Tenant: sandboxv1.TenantScope_TENANT_SCOPE_SAME_USER}}}},
	}
	res, err := api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		res, err := api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		st := res.Msg.GetStatus()
		if st.GetState() == sandboxv1.State_STATE_RUNNING {
			break
		}
		if time.Now().After(deadline) || st.GetState() == sandboxv1.State_STATE_FAILED {
			t.Fatalf("sandbox %s: %v", id, st)
		}
	}

	// The Pod.
	pod, err := s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	main := pod.Spec.Containers[1]
	sc := main.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("main container security context %+v", sc)
	}
	sizes := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if ed := v.EmptyDir; ed != nil && ed.SizeLimit != nil {
			sizes[v.Name] = string(ed.Medium) + "/" + ed.SizeLimit.String()
		}
	}
	if sizes["vol-0"] != "/64Mi" || sizes["vol-1"] != "Memory/32Mi" || sizes["writable-0"] != "Memory/256Mi" {
		t.Errorf("emptyDir sizes %v", sizes)
	}
	var mounts []string
	for _, m := range main.VolumeMounts {
		mounts = append(mounts, m.MountPath+"="+m.Name+"["+m.SubPath+"]"+map[bool]string{true: "ro", false: "rw"}[m.ReadOnly])
	}
	for _, want := range []string{"/data=vol-0[]rw", "/view=vol-0[sub]ro", "/mem=vol-1[]rw", "/tmp=writable-0[]rw", "/.sandboxd/run=run[]rw"} {
		if !slices.Contains(mounts, want) {
			t.Errorf("mounts %v: no %s", mounts, want)
		}
	}
	if pod.Annotations["example.com/via"] != "wire" || !slices.ContainsFunc(pod.Spec.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == "sandboxd.io/dedicated" }) {
		t.Errorf("the policy's pod fragment did not cross the wire: annotations %v, tolerations %v", pod.Annotations, pod.Spec.Tolerations)
	}

	// same_user: the Pod carries the caller's hash, the policy selects it.
	user := pod.Labels[kubernetes.LabelUser]
	np, err := s.Client.NetworkingV1().NetworkPolicies(c.namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Egress: DNS, the same user, the gate's hello to the runner.
	if user == "" || len(np.Spec.Egress) != 3 || np.Spec.Egress[1].To[0].PodSelector == nil ||
		np.Spec.Egress[1].To[0].PodSelector.MatchLabels[kubernetes.LabelUser] != user || len(np.Spec.Egress[1].Ports) != 0 {
		t.Errorf("same_user: pod label %q, egress %+v", user, np.Spec.Egress)
	}

	// Inside.
	ex, err := api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", strings.Join([]string{
		"id -u",
		"(touch /x) 2>&1 | grep -o 'Read-only file system'",
		"echo t > /tmp/t && cat /tmp/t",
		"mkdir -p /data/sub && echo d > /data/sub/f && cat /view/f",
		"(touch /view/g) 2>&1 | grep -o 'Read-only file system'",
		"echo m > /mem/f && cat /mem/f",
		"grep CapEff /proc/self/status | cut -f2",
	}, "; ")}}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(ex.Msg.GetStdout())), "1000\nRead-only file system\nt\nd\nRead-only file system\nm\n0000000000000000"; got != want {
		t.Errorf("inside: %q (stderr %q), want %q", got, ex.Msg.GetStderr(), want)
	}
	if _, err := api.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: id, Path: "/tmp/hello", Content: []byte("hi")})); err != nil {
		t.Fatalf("write file: %v", err)
	}
	rf, err := api.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: id, Path: "/tmp/hello"}))
	if err != nil || string(rf.Msg.GetContent()) != "hi" {
		t.Errorf("read file: %q %v", rf.Msg.GetContent(), err)
	}
	ex, err = api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"stat", "-c", "%u", "/tmp/hello"}}))
	if err != nil || strings.TrimSpace(string(ex.Msg.GetStdout())) != "1000" {
		t.Errorf("the written file's owner: %q %v", ex.Msg.GetStdout(), err)
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err := api.StreamLogs(lctx, connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: id, Follow: true}))
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	for stream.Receive() {
		logs.Write(stream.Msg().GetData())
		if strings.Contains(logs.String(), "\n") {
			break
		}
	}
	_ = stream.Close()
	if !strings.Contains(logs.String(), "started as 1000") {
		t.Errorf("logs %q (%v)", logs.String(), stream.Err())
	}
}
