package stack

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
)

// TestKubernetesNodeAgents: the runner's node-agent configuration reaches the backend at
// start: a TLS dir whose client certificate names another runner fails the start with
// the reason (before any sandbox is paused), as does a missing one.
func TestKubernetesNodeAgents(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.1:6443"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test node-agent CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueClient("runner", []*url.URL{pki.NodeAgentClientURI("runner-b")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tlsDir := t.TempDir()
	if err := nodeagent.WriteTLSDir(tlsDir, cert, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		dir, want string
	}{
		"another runner's certificate": {tlsDir, `node agents: --node-agent-tls-dir ` + tlsDir + `: the client certificate (tls.crt) names runner "runner-b", this runner is "runner-a"`},
		"no certificate":               {t.TempDir(), "node agents: --node-agent-tls-dir: nodeagent: tls:"},
	} {
		_, err := NewKubernetes(t.Context(), KubernetesConfig{Kubeconfig: kc, RunnerID: "runner-a", Namespace: "sbx",
			NodeAgents: nodeagentdial.DialConfig{Port: 7445, TLSDir: tc.dir}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
