package security

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/compose"
)

// TestEngineFileNeverReadsTheServerOrTheEngine (issue 19 point 5): under control
// CONTROL_CONTAINER_ENGINE a Compose file is refused for the same ways into the server's
// files and environment as under platform control, and the file handed to the engine is
// not interpolated a second time: a literal $VAR the caller wrote ($$VAR) stays literal
// under the engine's docker compose, whose environment is the engine container's, never
// becoming a value of that environment.
func TestEngineFileNeverReadsTheServerOrTheEngine(t *testing.T) {
	const marker = "sandboxd-engine-secret-91c2"
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret.env")
	if err := os.WriteFile(secret, []byte("LEAK="+marker+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SANDBOXD_SECURITY_LEAK", marker)
	t.Chdir(dir)
	engine := func(file string) (compose.Result, error) {
		return compose.Convert(context.Background(), &sandboxv1.CreateSandboxFromFileRequest{
			Type: sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE, Contents: []byte(file),
			Control: sandboxv1.Control_CONTROL_CONTAINER_ENGINE})
	}
	for name, file := range map[string]string{
		"env_file":      fmt.Sprintf("services: {a: {image: x, env_file: %s}}", secret),
		"extends":       fmt.Sprintf("services: {a: {extends: {file: %s, service: base}}}", secret),
		"secret env":    "secrets: {s: {environment: SANDBOXD_SECURITY_LEAK}}\nservices: {a: {image: x, secrets: [s]}}",
		"bind":          fmt.Sprintf("services: {a: {image: x, volumes: [\"%s:/s\"]}}", dir),
		"inherited env": "services: {a: {image: x, environment: [SANDBOXD_SECURITY_LEAK]}}",
		"variable":      "services: {a: {image: x, environment: {A: \"${SANDBOXD_SECURITY_LEAK}\"}}}",
		"privileged":    "services: {a: {image: x, privileged: true}}",
		"host network":  "services: {a: {image: x, network_mode: host}}",
		"host pid":      "services: {a: {image: x, pid: host}}",
	} {
		t.Run(name, func(t *testing.T) {
			res, err := engine(file)
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("err = %v, engine %+v; want INVALID_ARGUMENT", err, res.Extra.Engine)
			}
			if strings.Contains(err.Error(), marker) {
				t.Fatalf("the error carries the server's secret: %v", err)
			}
		})
	}

	res, err := engine(`services: {a: {image: x, command: ["sh", "-c", "echo $$SANDBOXD_SECURITY_LEAK"], environment: {B: "$${SANDBOXD_SECURITY_LEAK}"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	e := res.Extra.Engine
	if e == nil || strings.Contains(string(e.Compose), marker) {
		t.Fatalf("engine %+v", e)
	}
	// The engine's docker compose, with the secret in its environment.
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  "/",
		ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: e.Compose}},
		Environment: types.Mapping{"SANDBOXD_SECURITY_LEAK": marker},
	}, func(o *loader.Options) { o.SetProjectName(e.Project, true) })
	if err != nil {
		t.Fatalf("the engine's file does not load: %v\n%s", err, e.Compose)
	}
	a := p.Services["a"]
	if cmd := strings.Join(a.Command, " "); cmd != "sh -c echo $SANDBOXD_SECURITY_LEAK" {
		t.Errorf("command under the engine %q, want the caller's literal $", cmd)
	}
	if b := a.Environment["B"]; b == nil || *b != "${SANDBOXD_SECURITY_LEAK}" {
		t.Errorf("environment B under the engine %v, want the caller's literal ${…}", b)
	}
}
