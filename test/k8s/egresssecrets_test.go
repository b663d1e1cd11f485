package k8s

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// k8sSecretProbe runs in the sandbox: requests to the injection host and to the other
// granted host with the placeholder (argv[1] when given, else $API_TOKEN) in
// Authorization (Python's ssl trusts SSL_CERT_FILE = the CA emptyDir's bundle.pem), then
// what the sandbox can read: its environment, every process's environ, every file under
// the CA dir and the gate's dirs, whether each holds the value (given only as its
// first 16 bytes: the probe never holds it).
const k8sSecretProbe = `
import glob, hashlib, json, os, sys, urllib.request
ph = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("API_TOKEN", "")
needle = bytes.fromhex(sys.argv[1])
out = {"placeholder": os.environ.get("API_TOKEN", ""), "env": {k: os.environ.get(k, "") for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")}}
for name in ("api.inject.test", "other.inject.test"):
    try:
        req = urllib.request.Request("https://%s/echo" % name, headers={"Authorization": "Bearer " + ph})
        with urllib.request.urlopen(req, timeout=20) as r:
            out[name] = r.read().decode()
    except Exception as e:
        out[name] = "fail: %r" % (e,)
hits, files = [], 0
for p in glob.glob("/proc/[0-9]*/environ") + glob.glob("/etc/sandboxd-egress/*") + glob.glob("/.sandboxd/**", recursive=True) + glob.glob("/sandbox-gate*/**", recursive=True):
    try:
        data = open(p, "rb").read()
    except OSError:
        continue
    files += 1
    # A key in PEM (not the words in a binary's crypto code).
    if needle in data or not data.startswith(b"\x7fELF") and b"PRIVATE KEY-----" in data:
        hits.append(p)
out["read"], out["hits"] = files, hits
out["ca"] = sorted(os.listdir("/etc/sandboxd-egress"))
try:
    open("/etc/sandboxd-egress/x", "w")
    out["ca writable"] = True
except OSError:
    out["ca writable"] = False
print(json.dumps(out))
`

// TestKubernetesEgressSecrets (issue 23 point 3): a Kubernetes runner with its egress
// proxy and DNS on the node's bridge address, in front of an egresstest "internet". A
// sandbox whose rule for api.inject.test carries a secret gets a placeholder in its
// environment and the sandbox CA in /etc/sandboxd-egress (read-only, from the gate); the
// upstream server sees the real value, the other granted host the placeholder unchanged;
// no env, /proc/*/environ or file of the sandbox holds the value; a second sandbox sending
// the first's placeholder gets it unchanged; the Pod, its Secret, the roots ConfigMap and
// the NetworkPolicy hold no value and no CA key; each use is audited; after a runner
// restart the injection host is refused (access_denied) and audited, the other host
// still spliced.
func TestKubernetesEgressSecrets(t *testing.T) {
	c := needCluster(t)
	prefix, err := netip.ParsePrefix(env("SANDBOXD_K8S_POD_CIDR", "10.214.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	gw := prefix.Masked().Addr().Next()
	bridgeUp(t, c, gw)

	in := egresstest.New(t)
	apiIP, otherIP := in.Addr(t), in.Addr(t)
	in.SetA("api.inject.test", apiIP)
	in.SetA("other.inject.test", otherIP)
	in.ServeHTTPS(t, apiIP, "api.inject.test")
	in.ServeHTTPS(t, otherIP, "other.inject.test")
	caFile := filepath.Join(t.TempDir(), "internet-ca.pem")
	if err := os.WriteFile(caFile, in.CA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	const value = "k8s-egress-VALUE-0d1e2f3a4b5c"

	runnerID := randomID("test-")
	dataDir := t.TempDir()
	helloListen, helloAddr := helloAddrs(t)
	runnerPeer := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: gw.String() + "/32"}}
	newRunner := func() *stack.KubernetesStack {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := stack.NewKubernetes(ctx, stack.KubernetesConfig{
			Kubeconfig: c.kubeconfig, DataDir: dataDir,
			Backend: &kubernetes.Config{
				Namespace: c.namespace, RunnerID: runnerID, AgentImage: c.agentImage,
				ImagePullPolicy: corev1.PullNever, ImageConfig: localImageConfig, TerminationGrace: 5 * time.Second,
				HelloListen: helloListen, HelloAddr: helloAddr,
				RunnerPeers: []networkingv1.NetworkPolicyPeer{runnerPeer},
				// gVisor too: its containers reach the gate's CA emptyDir through their own gofers.
				RuntimeClasses: map[string]string{"runc": "", "gvisor": "gvisor"},
			},
			Egress: &stack.KubernetesEgress{
				ProxyListen: net.JoinHostPort(gw.String(), "443"), DNSListen: net.JoinHostPort(gw.String(), "53"),
				ProxyAddrs: []netip.Addr{gw}, DNSAddr: gw,
				Upstreams: []string{in.DNS.String()}, Resolver: in.Resolver(),
				// The proxy verifies api.inject.test against the Internet's CA; the
				// sandboxes trust it (the roots ConfigMap) for other.inject.test.
				UpstreamCAFile: caFile, RootsFile: caFile,
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := newRunner()
	closed := false
	t.Cleanup(func() {
		if !closed {
			s.Close()
		}
		deleteRunnerObjects(s.Client, c.namespace, runnerID)
	})
	if sup := s.Backend.Support(); sup.NoEgressSecrets || sup.NoDNSEgress {
		t.Fatalf("a runner with its egress proxy reports %+v", sup)
	}

	secretRule := runtime.EgressRule{DNSName: "api.inject.test", Secret: &runtime.EgressSecret{Store: "vault", Path: "api", EnvVar: "API_TOKEN"}}
	createClass := func(class string, rules ...runtime.EgressRule) string {
		t.Helper()
		spec := runtime.Spec{
			Container:    runtime.Container{Image: python, Command: "sleep", Args: []string{"3600"}},
			Network:      &runtime.Network{Egress: rules},
			RuntimeClass: class,
		}
		if len(rules) > 0 && rules[0].Secret != nil {
			spec.EgressSecretValues = map[string]string{"vault/api": value}
		}
		sb, err := s.Runner.Create(context.Background(), runner.CreateRequest{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		if sb := waitState(t, s.Runner, sb.ID, 2*time.Minute, running); sb.State != runner.StateRunning {
			t.Fatalf("state %s (%s: %s)", sb.State, sb.Reason, sb.Message)
		}
		return sb.ID
	}
	create := func(rules ...runtime.EgressRule) string { t.Helper(); return createClass("", rules...) }
	probe := func(id string, args ...string) map[string]any {
		t.Helper()
		res := exec(t, s.Runner, id, append([]string{"python3", "-c", k8sSecretProbe, hex.EncodeToString([]byte(value[:16]))}, args...)...)
		if strings.Contains(string(res.GetStdout()), value) || strings.Contains(string(res.GetStderr()), value) {
			t.Fatalf("the probe's output holds the value")
		}
		var out map[string]any
		if err := json.Unmarshal(res.GetStdout(), &out); err != nil {
			t.Fatalf("probe: exit %d: %q %q: %v", res.GetExitCode(), res.GetStdout(), res.GetStderr(), err)
		}
		t.Logf("probe of %s: %v", id, out)
		return out
	}

	id := create(secretRule, runtime.EgressRule{DNSName: "other.inject.test"})
	out := probe(id)
	ph, _ := out["placeholder"].(string)
	if !strings.HasPrefix(ph, "sbx-secret-") {
		t.Fatalf("API_TOKEN %q: want a placeholder", ph)
	}
	if got, want := out["api.inject.test"], "authorization="+egresstest.EchoHash("Bearer "+value); !strings.Contains(str(got), want) {
		t.Errorf("the injection host saw %q, want the value (%s)", got, want)
	}
	if got, want := out["other.inject.test"], "authorization="+egresstest.EchoHash("Bearer "+ph); !strings.Contains(str(got), want) {
		t.Errorf("the other host saw %q, want the placeholder unchanged (%s)", got, want)
	}
	if hits, _ := out["hits"].([]any); len(hits) != 0 {
		t.Errorf("the value or a key is readable in the sandbox: %v", hits)
	}
	if n, _ := out["read"].(float64); n < 3 {
		t.Errorf("the probe read only %v files", n)
	}
	envs, _ := out["env"].(map[string]any)
	if envs["SSL_CERT_FILE"] != "/etc/sandboxd-egress/bundle.pem" || envs["NODE_EXTRA_CA_CERTS"] != "/etc/sandboxd-egress/ca.pem" {
		t.Errorf("CA variables %v", envs)
	}
	if cas := str(out["ca"]); !strings.Contains(cas, "bundle.pem") || !strings.Contains(cas, "ca.pem") {
		t.Errorf("/etc/sandboxd-egress holds %s", cas)
	}
	if out["ca writable"] != false {
		t.Error("/etc/sandboxd-egress is writable")
	}

	// A second sandbox (with the same rule and value of its own) sending the first's
	// placeholder: its own CA, its own placeholder; the first's goes out unchanged.
	id2 := create(secretRule)
	out2 := probe(id2, ph)
	ph2, _ := out2["placeholder"].(string)
	if !strings.HasPrefix(ph2, "sbx-secret-") || ph2 == ph {
		t.Errorf("second sandbox's API_TOKEN %q: want a placeholder of its own", ph2)
	}
	if got, want := out2["api.inject.test"], "authorization="+egresstest.EchoHash("Bearer "+ph); !strings.Contains(str(got), want) {
		t.Errorf("another sandbox's placeholder: the host saw %q, want it unchanged (%s)", got, want)
	}

	// A gVisor sandbox: the gate's install writes the CA files into the memory emptyDir
	// through its gofer, and the workload container (another gofer) reads them: it trusts
	// its CA (the injection host gets the value) and the roots (the other host).
	idG := createClass("gvisor", secretRule, runtime.EgressRule{DNSName: "other.inject.test"})
	outG := probe(idG)
	phG, _ := outG["placeholder"].(string)
	if got, want := outG["api.inject.test"], "authorization="+egresstest.EchoHash("Bearer "+value); !strings.Contains(str(got), want) {
		t.Errorf("gvisor: the injection host saw %q, want the value (%s)", got, want)
	}
	if got, want := outG["other.inject.test"], "authorization="+egresstest.EchoHash("Bearer "+phG); !strings.Contains(str(got), want) {
		t.Errorf("gvisor: the other host saw %q, want the placeholder unchanged (%s)", got, want)
	}
	if cas := str(outG["ca"]); !strings.Contains(cas, "bundle.pem") || !strings.Contains(cas, "ca.pem") || outG["ca writable"] != false {
		t.Errorf("gvisor: /etc/sandboxd-egress holds %s, writable %v", cas, outG["ca writable"])
	}
	if hits, _ := outG["hits"].([]any); len(hits) != 0 {
		t.Errorf("gvisor: the value or a key is readable in the sandbox: %v", hits)
	}

	// What the API server holds: no value, neither sandbox's placeholder, no private key
	// PEM (in the Secrets' egress items and the roots ConfigMap).
	ctx := context.Background()
	var blobs []string
	for _, sid := range []string{id, id2} {
		pod, err := s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+sid, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ct := range pod.Spec.Containers {
			for _, m := range ct.VolumeMounts {
				if m.MountPath == "/etc/sandboxd-egress" && !m.ReadOnly {
					t.Errorf("container %s mounts the CA dir writable", ct.Name)
				}
			}
		}
		j, _ := json.Marshal(pod)
		blobs = append(blobs, string(j))
		if np, err := s.Client.NetworkingV1().NetworkPolicies(c.namespace).Get(ctx, "sbx-"+sid, metav1.GetOptions{}); err == nil {
			j, _ := json.Marshal(np)
			blobs = append(blobs, string(j))
		} else {
			t.Error(err)
		}
	}
	secs, err := s.Client.CoreV1().Secrets(c.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range secs.Items {
		for k, v := range sec.Data {
			blobs = append(blobs, sec.Name+"/"+k+": "+string(v))
			if strings.Contains(k, "egress") && (strings.Contains(string(v), "PRIVATE KEY") || !strings.Contains(string(v), "CERTIFICATE")) {
				t.Errorf("Secret %s item %s: want the CA certificate only, got %.100q", sec.Name, k, v)
			}
		}
	}
	cm, err := s.Client.CoreV1().ConfigMaps(c.namespace).Get(ctx, gate.EgressRootsConfigMapName(runnerID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	j, _ := json.Marshal(cm)
	blobs = append(blobs, string(j))
	if strings.Contains(string(j), "PRIVATE KEY") {
		t.Error("the roots ConfigMap holds a private key")
	}
	for _, b := range blobs {
		if strings.Contains(b, value) || strings.Contains(b, ph) || ph2 != "" && strings.Contains(b, ph2) {
			t.Errorf("an API object holds the value or a placeholder: %.300s", b)
		}
	}

	// The audit line (the runner's data dir), without the value.
	auditPath := filepath.Join(dataDir, stack.EgressAuditFile)
	audit, err := os.ReadFile(auditPath)
	if err != nil || !strings.Contains(string(audit), id) || !strings.Contains(string(audit), "api.inject.test") || strings.Contains(string(audit), value) {
		t.Errorf("audit %v:\n%s", err, audit)
	}

	// A runner restart: values and CA key were in this process only. The re-adopted
	// sandbox's connections to the injection host are refused and audited; the other
	// host still works.
	s.Close()
	closed = true
	s = newRunner()
	closed = false
	if sb := waitState(t, s.Runner, id, time.Minute, running); sb.State != runner.StateRunning {
		t.Fatalf("after the restart: state %s (%s: %s)", sb.State, sb.Reason, sb.Message)
	}
	var after map[string]any
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		after = probe(id)
		if !strings.Contains(str(after["other.inject.test"]), "fail") || time.Now().After(deadline) {
			break // the registry has the Pod's address once the informer synced
		}
	}
	if a := strings.ToLower(str(after["api.inject.test"])); !strings.Contains(a, "fail") || !strings.Contains(a, "access") {
		t.Errorf("after the restart the injection host: %q, want refused (access denied)", after["api.inject.test"])
	}
	if got, want := after["other.inject.test"], "authorization="+egresstest.EchoHash("Bearer "+ph); !strings.Contains(str(got), want) {
		t.Errorf("after the restart the other host: %q", got)
	}
	audit, _ = os.ReadFile(auditPath)
	if !strings.Contains(string(audit), "no longer holds this sandbox's secrets") || strings.Contains(string(audit), value) {
		t.Errorf("audit after the restart:\n%s", audit)
	}
}

func str(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}
