package security

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// TestK8sSecretValueNeverInAgentConfig (issue 23: secrets are never persisted): on a
// Kubernetes runner a KUBERNETES secret store's value reaches the main container's
// environment by secretKeyRef; sandbox-gate exec-agent writes the completed agent config
// to the Pod's disk-backed run emptyDir. The value must not be in that file, even when
// the image or the spec sets a variable of the same name (the secret wins, from the
// agent's own environment, never through the file). The real-cluster version is test/k8s
// TestKubernetesSecretsOutOfFiles.
func TestK8sSecretValueNeverInAgentConfig(t *testing.T) {
	const value = "s3cret-value-7c1d"
	c := &agentconfig.Config{Argv: []string{"sh"}, Env: []string{"TOKEN=from-spec", "A=1"}, EnvFromProcess: []string{"TOKEN"}}
	environ := []string{"PATH=/bin", "TOKEN=" + value}
	gate.CompleteConfig(c, environ, "/")
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), value) {
		t.Fatalf("the completed agent config holds the secret's value: %s", b)
	}
	// The agent, from the file and its environment, runs commands with the value.
	var loaded agentconfig.Config
	if err := json.Unmarshal(b, &loaded); err != nil {
		t.Fatal(err)
	}
	loaded.TakeEnvFromProcess(func(k string) (string, bool) {
		for _, kv := range environ {
			if n, v, _ := strings.Cut(kv, "="); n == k {
				return v, true
			}
		}
		return "", false
	})
	if got := strings.Join(loaded.Env, " "); !strings.Contains(got, "TOKEN="+value) || strings.Contains(got, "from-spec") {
		t.Errorf("the agent's env: %q", got)
	}
}
