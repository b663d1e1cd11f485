package e2e

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// noKeys accepts no API key: the test reaches the registry with platform tokens only.
type noKeys struct{}

func (noKeys) Authenticate(string) (auth.Principal, error) {
	return auth.Principal{}, auth.ErrInvalidKey
}

// TestRegistryImageRuns pushes the busybox test image to the platform registry with a
// push token (as an image build does), and a sandbox of org-a runs it: the gateway hands
// the runner a pull token minted for org-a. org-b's sandbox of the same image fails to
// pull (its token does not read org-a's repository).
func TestRegistryImageRuns(t *testing.T) {
	dir := t.TempDir()
	srv := httptest.NewUnstartedServer(nil)
	srv.Start()
	host := strings.TrimPrefix(srv.URL, "http://")
	reg, err := registry.New(context.Background(), registry.Config{Dir: filepath.Join(dir, "registry"), Auth: noKeys{},
		TokenKey: []byte(strings.Repeat("e", 32)), Host: host})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = reg
	t.Cleanup(func() { srv.Close(); reg.Close() })

	imgs, err := testimage.StandardImages()
	if err != nil {
		t.Fatal(err)
	}
	push, err := reg.MintPushToken("org-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dig, err := testimage.PushAuth(host, "org-a/bb:v1", imgs.Busybox, &image.Credentials{Username: "build", Password: push})
	if err != nil {
		t.Fatal(err)
	}

	cfg := env.StackConfig(filepath.Join(dir, "stack"))
	cfg.InsecureRegistries = append(cfg.InsecureRegistries, host)
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Cleanup(func() { finish(t, s, cfg.DataDir) })
	g := startGatewayOn(t, s, func(c *gateway.Config) { c.RegistryCredentials = reg.PullCredentials })

	ref := host + "/org-a/bb:v1"
	sb := g.create(t, spec(ref, "/bin/sh", "-c", `trap "exit 0" TERM; sleep infinity & wait`), "")
	g.waitState(t, sb.GetSandboxId(), sandboxv1.State_STATE_RUNNING)

	// org-b, by tag and by digest (the image is in the runner's cache now: a cached
	// digest is served without the registry unless the caller's access is checked).
	for _, ref := range []string{ref, host + "/org-a/bb@" + dig} {
		orgBFails(t, g, ref)
	}
}

// orgBFails checks that org-b's sandbox of org-a's registry image ref fails (pull
// refused) rather than runs.
func orgBFails(t *testing.T, g *gw, ref string) {
	t.Helper()
	other, err := g.other.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec(ref, "/bin/true")}}))
	if err == nil {
		deadline := time.Now().Add(60 * time.Second)
		for {
			res, err := g.other.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: other.Msg.GetSandboxId()}))
			if err != nil {
				t.Fatal(err)
			}
			st := res.Msg.GetStatus()
			if st.GetState() == sandboxv1.State_STATE_FAILED {
				break
			}
			if st.GetState() != sandboxv1.State_STATE_CREATING || time.Now().After(deadline) {
				t.Fatalf("org-b's sandbox of org-a's image: %s (%s), want FAILED", st.GetState(), st.GetStateReason())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
