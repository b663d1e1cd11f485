package security

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// authLog records the Authorization headers a registry received.
type authLog struct {
	mu       sync.Mutex
	requests int
	headers  []string
}

func (a *authLog) record(r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests++
	if h := r.Header.Get("Authorization"); h != "" {
		a.headers = append(a.headers, h)
	}
}

// saw reports whether any header carried secret, as sent or base64-decoded (Basic).
func (a *authLog) saw(secret string) (bool, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, h := range a.headers {
		_, v, _ := strings.Cut(h, " ")
		dec, _ := base64.StdEncoding.DecodeString(v)
		if strings.Contains(h, secret) || bytes.Contains(dec, []byte(secret)) {
			return true, a.requests
		}
	}
	return false, a.requests
}

// TestBuildBaseCredentialsStayHome attacks a build's base-image credentials (the
// organization's platform-registry pull token, runner.BuildRequest.BaseCredentials): a
// Dockerfile whose FROM names another registry — here a loopback registry on another
// port of the same host that asks for Basic credentials and records every Authorization
// header — must never receive the token (the build fails to pull its base: fine). The
// control: a FROM naming the platform registry's host gets the token and builds.
// A real build: a local stack, the gVisor builder, the runner's image store.
func TestBuildBaseCredentialsStayHome(t *testing.T) {
	if testing.Short() {
		t.Skip("a real build")
	}
	_, err := testimage.BuilderTar()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	testenv.RequireRoot(t, "runsc, namespaces")
	e, err := stacktest.Setup("bcred")
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	token := "sbxreg.org-pull-token-" + strings.Repeat("x", 16)
	var platformLog, attackerLog authLog
	platform, stopPlatform, err := testimage.StartRegistryWith(ctx, testimage.RegistryOptions{
		BasicAuth: &image.Credentials{Username: "sandboxd", Password: token}, OnRequest: platformLog.record})
	if err != nil {
		t.Fatal(err)
	}
	defer stopPlatform()
	attacker, stopAttacker, err := testimage.StartRegistryWith(ctx, testimage.RegistryOptions{
		BasicAuth: &image.Credentials{Username: "attacker", Password: "wants-the-token"}, OnRequest: attackerLog.record})
	if err != nil {
		t.Fatal(err)
	}
	defer stopAttacker()
	bref, err := name.ParseReference(e.Busybox(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := remote.Image(bref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testimage.PushAuth(platform, "org-a/base:1", busybox, &image.Credentials{Username: "sandboxd", Password: token}); err != nil {
		t.Fatal(err)
	}
	if _, err := testimage.PushAuth(attacker, "org-a/base:1", busybox, &image.Credentials{Username: "attacker", Password: "wants-the-token"}); err != nil {
		t.Fatal(err)
	}

	cfg := e.StackConfig(t.TempDir())
	cfg.InsecureRegistries = append(cfg.InsecureRegistries, platform, attacker) // both loopback
	st, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		st.Close()
		if err := st.Network.Cleanup(); err != nil {
			t.Errorf("network cleanup: %v", err)
		}
	}()
	l := runner.NewLocal("r1", st.Runner)
	if !slices.Contains(l.Classes(), runner.BuildRuntimeClass) {
		t.Skipf("no gvisor class on this machine (%v)", l.Classes())
	}
	if l.BuilderImage, err = testimage.PushBuilder(e.Registry); err != nil {
		t.Fatal(err)
	}
	l.BuildImages, l.BuildCacheBytes = st.BaseArchiver(), -1

	build := func(from string) (*runner.BuildResult, string, error) {
		t.Helper()
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+from+"\nRUN true\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		root, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		var archive bytes.Buffer
		if _, err := fsarchive.Write(ctx, root, &archive, fsarchive.IDMap{}); err != nil {
			t.Fatal(err)
		}
		var lines []string
		res, err := l.Build(ctx, runner.BuildRequest{
			Context: &archive, ContextLimits: runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 10},
			BaseCredentials:         &runtime.Credentials{Username: "sandboxd", Password: token},
			BaseCredentialsRegistry: platform,
			Push:                    e.Registry + "/org-a/built:1", PushInsecure: true, OrganizationID: "org-a",
			Resources: runtime.Resources{MilliCPU: 2000, MemoryBytes: 2 << 30, Pids: 1024}, Timeout: 4 * time.Minute,
		}, func(ev imagebuild.Event) {
			if ev.Step == nil {
				lines = append(lines, ev.Line)
			}
		})
		return res, strings.Join(lines, "\n"), err
	}

	// The attack: FROM another registry (another port of the same host).
	res, out, err := build(attacker + "/org-a/base:1")
	if leaked, n := attackerLog.saw(token); leaked || n == 0 {
		t.Errorf("the attacker's registry got %d requests, the platform token among their headers: %v", n, leaked)
	}
	if err == nil && res.ExitCode == 0 {
		t.Errorf("a build whose base needs the attacker's own credentials succeeded\n%s", out)
	}
	t.Logf("FROM the attacker's registry: %v (the base is not pulled without its credentials)", err)

	// The control: FROM the platform registry gets the token and builds.
	res, out, err = build(platform + "/org-a/base:1")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("FROM the platform registry: %v %+v\n%s", err, res, out)
	}
	if got, n := platformLog.saw(token); !got {
		t.Errorf("the platform registry got %d requests, none with the token", n)
	}
}
