package security

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/compose"
)

// TestComposeNeverReadsTheServersFilesOrEnvironment (issue 19): a Compose file sent to
// CreateSandboxFromFile is parsed from its bytes alone. Every way Compose has to pull in a
// file or a variable of the machine that parses it (env_file, label_file, extends, include,
// file secrets and configs, host bind mounts, an environment entry without a value, a
// variable without a default) is refused, and the server's file and variable never show
// up in a spec or an error.
func TestComposeNeverReadsTheServersFilesOrEnvironment(t *testing.T) {
	const marker = "sandboxd-server-secret-7f3a"
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret.env")
	if err := os.WriteFile(secret, []byte("LEAK="+marker+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other.yaml")
	if err := os.WriteFile(other, []byte("services: {base: {image: x, environment: {LEAK: "+marker+"}}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SANDBOXD_SECURITY_LEAK", marker)
	t.Chdir(dir)
	files := map[string]string{
		"env_file":          fmt.Sprintf("services: {a: {image: x, env_file: %s}}", secret),
		"env_file relative": "services: {a: {image: x, env_file: secret.env}}",
		"label_file":        fmt.Sprintf("services: {a: {image: x, label_file: %s}}", secret),
		"extends":           fmt.Sprintf("services: {a: {extends: {file: %s, service: base}}}", other),
		"include":           fmt.Sprintf("include: [%s]\nservices: {a: {image: x}}", other),
		"secret file":       fmt.Sprintf("secrets: {s: {file: %s}}\nservices: {a: {image: x, secrets: [s]}}", secret),
		"secret env":        "secrets: {s: {environment: SANDBOXD_SECURITY_LEAK}}\nservices: {a: {image: x, secrets: [s]}}",
		"config file":       fmt.Sprintf("configs: {c: {file: %s}}\nservices: {a: {image: x, configs: [c]}}", secret),
		"bind":              fmt.Sprintf("services: {a: {image: x, volumes: [\"%s:/s\"]}}", dir),
		"bind relative":     "services: {a: {image: x, volumes: [\"./:/s\"]}}",
		"bind home":         "services: {a: {image: x, volumes: [\"~/:/s\"]}}",
		"bind long":         fmt.Sprintf("services: {a: {image: x, volumes: [{type: bind, source: %s, target: /s}]}}", dir),
		"bind variable":     "services: {a: {image: x, volumes: [\"${SANDBOXD_SECURITY_LEAK:-/}:/s\"]}}",
		"inherited env":     "services: {a: {image: x, environment: [SANDBOXD_SECURITY_LEAK]}}",
		"inherited env map": "services: {a: {image: x, environment: {SANDBOXD_SECURITY_LEAK: null}}}",
		"variable":          "services: {a: {image: x, environment: {A: \"${SANDBOXD_SECURITY_LEAK}\"}}}",
		"bare variable":     "services: {a: {image: x, environment: {A: \"$SANDBOXD_SECURITY_LEAK\"}}}",
		"required variable": "services: {a: {image: x, environment: {A: \"${SANDBOXD_SECURITY_LEAK:?}\"}}}",
		"variable in image": "services: {a: {image: \"${SANDBOXD_SECURITY_LEAK}\"}}",
	}
	for name, file := range files {
		t.Run(name, func(t *testing.T) {
			res, err := compose.Convert(context.Background(), &sandboxv1.CreateSandboxFromFileRequest{
				Type: sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE, Contents: []byte(file), PrimaryService: "a"})
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("err = %v, spec %v; want INVALID_ARGUMENT", err, res.Spec)
			}
			if strings.Contains(err.Error(), marker) {
				t.Fatalf("the error carries the server's secret: %v", err)
			}
		})
	}
	// A default is the file's own text: it is used, and the server's value is not.
	res, err := compose.Convert(context.Background(), &sandboxv1.CreateSandboxFromFileRequest{
		Type: sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE, PrimaryService: "a",
		Contents: []byte(`services: {a: {image: x, environment: {A: "${SANDBOXD_SECURITY_LEAK:-mine}", B: "${SANDBOXD_SECURITY_LEAK-mine}"}}}`)})
	if err != nil {
		t.Fatal(err)
	}
	if env := res.Spec.GetContainers()[0].GetEnvironmentVariables(); env["A"] != "mine" || env["B"] != "mine" {
		t.Fatalf("environment %v: want the file's defaults, never the server's variable", env)
	}
}
