package sbxcli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/pki"
)

func TestSbxAdminCluster(t *testing.T) {
	admin, user := controlPlane(t)
	sbx := func(base []string, args ...string) (string, string, int) {
		return runSbx(context.Background(), "", append(append([]string{}, base...), args...)...)
	}
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "ca"), "test")
	if err != nil {
		t.Fatal(err)
	}
	const secret = "sa-token-that-must-not-show"
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tok, caFile := write("token", secret+"\n"), write("ca.pem", string(ca.CertPEM()))
	kc := write("kubeconfig", `apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://kube.example:6443"}}]
users: [{name: u, user: {token: `+secret+`}}]
`)

	out, errs, code := sbx(admin, "admin", "cluster", "add", "prod-1", "--server", "https://10.0.0.1:6443", "--token-file", tok, "--ca-file", caFile)
	if code != 0 || !strings.Contains(out, "SERVICE_ACCOUNT_TOKEN (stored encrypted, never shown)") || strings.Contains(out, secret) {
		t.Fatalf("add token: %d %q %q", code, out, errs)
	}
	out, errs, code = sbx(admin, "admin", "cluster", "add", "prod-2", "--kubeconfig", kc)
	if code != 0 || !strings.Contains(out, "https://kube.example:6443") || !strings.Contains(out, "KUBECONFIG") {
		t.Fatalf("add kubeconfig: %d %q %q", code, out, errs)
	}
	// Refused by the server, with the field named.
	_, errs, code = sbx(admin, "admin", "cluster", "add", "prod-3", "--server", "http://10.0.0.1", "--token-file", tok, "--ca-file", caFile)
	if code == 0 || !strings.Contains(errs, "cluster.server") {
		t.Fatalf("add http: %d %q", code, errs)
	}
	// Refused here.
	if _, errs, code = sbx(admin, "admin", "cluster", "add", "prod-3"); code == 0 || !strings.Contains(errs, "credential is required") {
		t.Fatalf("add without credential: %d %q", code, errs)
	}
	if _, errs, code = sbx(admin, "admin", "cluster", "add", "prod-3", "--kubeconfig", kc, "--token-file", tok); code == 0 || !strings.Contains(errs, "not both") {
		t.Fatalf("add with both: %d %q", code, errs)
	}
	out, errs, code = sbx(admin, "admin", "cluster", "ls")
	if code != 0 || !strings.Contains(out, "prod-1") || !strings.Contains(out, "prod-2") || strings.Contains(out, secret) {
		t.Fatalf("ls: %d %q %q", code, out, errs)
	}
	out, _, code = sbx(admin, "-o", "json", "admin", "cluster", "get", "prod-2")
	var c map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &c) != nil || c["clusterId"] != "prod-2" || strings.Contains(out, secret) || c["kubeconfig"] != nil {
		t.Fatalf("get -o json: %d %q", code, out)
	}
	// A runner names prod-1: rm is refused and says which.
	if out, errs, code := sbx(admin, "admin", "runner", "create", "r1", "--cluster-id", "prod-1", "--zone", "z1"); code != 0 {
		t.Fatalf("runner create: %d %q %q", code, out, errs)
	}
	if _, errs, code = sbx(admin, "admin", "cluster", "rm", "prod-1"); code == 0 || !strings.Contains(errs, "r1") {
		t.Fatalf("rm in use: %d %q", code, errs)
	}
	if out, errs, code = sbx(admin, "admin", "cluster", "rm", "prod-2"); code != 0 || !strings.Contains(out, "removed") {
		t.Fatalf("rm: %d %q %q", code, out, errs)
	}
	if _, errs, code = sbx(admin, "admin", "cluster", "get", "prod-2"); code == 0 || !strings.Contains(errs, "not found") {
		t.Fatalf("get removed: %d %q", code, errs)
	}
	if _, errs, code := sbx(user, "admin", "cluster", "ls"); code == 0 || !strings.Contains(strings.ToLower(errs), "permission") {
		t.Fatalf("user key: %d %q", code, errs)
	}
}
