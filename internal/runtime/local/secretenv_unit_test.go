package local

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestStartConfigsKeepSecretsOutOfTheFile: Start's config carries the secret environment
// over the plain one; the config file's (and /.sandboxd/config.json's) does not.
func TestStartConfigsKeepSecretsOutOfTheFile(t *testing.T) {
	cfg := &agentconfig.Config{Argv: []string{"/bin/sh"}, Env: []string{"PATH=/bin", "A=plain"}, WorkingDir: "/"}
	start, shown, err := startConfigs(cfg, map[string]string{"TOKEN": "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	var got agentconfig.Config
	if err := json.Unmarshal(start, &got); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(got.Env, "\n"), "TOKEN=s3cret") || !strings.Contains(strings.Join(got.Env, "\n"), "A=plain") {
		t.Fatalf("start env %v", got.Env)
	}
	if strings.Contains(string(shown), "s3cret") || strings.Contains(string(shown), "TOKEN") {
		t.Fatalf("shown config %s", shown)
	}
	if len(cfg.Env) != 2 {
		t.Fatalf("the caller's config changed: %v", cfg.Env)
	}
	// Without secrets both are the config.
	start, shown, err = startConfigs(cfg, nil)
	if err != nil || string(start) != string(shown) {
		t.Fatalf("no secrets: %s %s %v", start, shown, err)
	}
	// The record of a sandbox keeps none.
	cs := withoutSecretEnv([]runtime.Container{{Name: "a", SecretEnv: map[string]string{"X": "y"}}})
	if cs[0].SecretEnv != nil || withoutSecretEnv(nil) != nil {
		t.Fatal("withoutSecretEnv")
	}
}
