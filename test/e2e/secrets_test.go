package e2e

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// grepTree reports the regular files under root that contain any of needles: every
// file of root's file system (each read up to 64 MiB; symlinks not followed), not the
// file systems mounted inside it (running containers' root file systems, /proc).
func grepTree(t *testing.T, root string, needles ...string) []string {
	t.Helper()
	var rootDev uint64
	if st, err := os.Stat(root); err == nil {
		rootDev = st.Sys().(*syscall.Stat_t).Dev
	}
	var hits []string
	files := 0
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			if st, err := os.Lstat(p); err == nil && st.Sys().(*syscall.Stat_t).Dev != rootDev {
				return filepath.SkipDir // another file system mounted here
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		b, _ := io.ReadAll(io.LimitReader(f, 64<<20))
		files++
		for _, nd := range needles {
			if bytes.Contains(b, []byte(nd)) {
				hits = append(hits, p)
			}
		}
		return nil
	})
	if files == 0 {
		t.Fatalf("no files under %s", root)
	}
	return hits
}

// TestSecretsFromStore (issue 23 point 2): a secret of the organization's built-in store
// becomes an environment variable of the named container (exec env shows it) and is
// absent from GetSandbox, the runner's and gateway's data dirs (every file, grepped) and
// the logs; image pull credentials from the store pull an image from a registry that
// requires authentication, which fails without them.
func TestSecretsFromStore(t *testing.T) {
	const value = "e2e-secret-value-7f3c9a1b"
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// A registry that requires authentication (the platform registry: tokens only).
	srv := httptest.NewUnstartedServer(nil)
	srv.Start()
	host := strings.TrimPrefix(srv.URL, "http://")
	reg, err := registry.New(ctx, registry.Config{Dir: filepath.Join(dir, "registry"), Auth: noKeys{},
		TokenKey: []byte(strings.Repeat("s", 32)), Host: host})
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
	if _, err := testimage.PushAuth(host, "org-a/private:v1", imgs.Busybox, &image.Credentials{Username: "build", Password: push}); err != nil {
		t.Fatal(err)
	}
	pullUser, pullPass, ok := reg.PullCredentials("org-a", host+"/org-a/private:v1")
	if !ok {
		t.Fatal("no pull credentials")
	}

	logs := &logbuf.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	stackDir := filepath.Join(dir, "stack")
	cfg := env.StackConfig(stackDir)
	cfg.InsecureRegistries = append(cfg.InsecureRegistries, host)
	cfg.Logger = logger
	s, err := stack.NewLocal(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Cleanup(func() { finish(t, s, cfg.DataDir) })

	gwDir := filepath.Join(dir, "gateway")
	st, err := store.Open(ctx, filepath.Join(gwDir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ring, err := secretbox.LoadOrCreate(filepath.Join(gwDir, secretbox.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	var adminKey string
	g := startGatewayOn(t, s, func(c *gateway.Config) {
		c.Logger = logger
		c.Secrets = gateway.SecretOptions{Store: st.SecretStores(), Keys: ring}
		adminKey, _, _ = c.Auth.(*auth.Keyring).Create("org-a", auth.RoleAdmin, "")
	})
	hc := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
	adminOpts := []connect.ClientOption{connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(adminKey))}
	settings := sandboxv1connect.NewSettingsServiceClient(hc, g.url, adminOpts...)
	secrets := settingsv1connect.NewSecretServiceClient(hc, g.url, adminOpts...)
	if _, err := settings.CreateSecretStore(ctx, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: "prod"}})); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*settingsv1.PutSecretRequest{
		{StoreName: "prod", Path: "db/main", Field: "password", Value: value},
		{StoreName: "prod", Path: "registry", Value: pullUser + ":" + pullPass},
	} {
		if _, err := secrets.PutSecret(ctx, connect.NewRequest(p)); err != nil {
			t.Fatal(err)
		}
	}

	// The secret as an environment variable of the container.
	sp := spec(busybox(), "/bin/sh", "-c", `trap "exit 0" TERM; sleep infinity & wait`)
	sp.Containers[0].SecretStores = []*sandboxv1.SecretStoreReference{{StoreName: "prod",
		Secrets: []*sandboxv1.SecretMapping{{Path: "db/main", Field: "password", EnvVar: "DB_PASSWORD"}}}}
	sb := g.create(t, sp, "")
	g.waitState(t, sb.GetSandboxId(), sandboxv1.State_STATE_RUNNING)
	ex, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.GetSandboxId(), Command: []string{"env"}}))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ex.Msg.GetStdout()), "DB_PASSWORD="+value+"\n") {
		t.Fatalf("env in the container lacks the secret:\n%s", ex.Msg.GetStdout())
	}
	// Not in what the API returns.
	got, err := g.sandboxes.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: sb.GetSandboxId()}))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := protojson.Marshal(got.Msg)
	if strings.Contains(string(b), value) || !strings.Contains(string(b), "DB_PASSWORD") {
		t.Fatalf("GetSandbox: %s", b)
	}
	list, err := g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := protojson.Marshal(list.Msg); strings.Contains(string(b), value) {
		t.Fatal("ListSandboxes returns the value")
	}

	// A group: the sidecar's secret is the sidecar's only (the primary does not get it);
	// its agent starts held and gets the secret with Start (local backend's group path).
	grp := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{
		{Name: "main", Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`}, Primary: proto.Bool(true)},
		{Name: "side", Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`},
			SecretStores: []*sandboxv1.SecretStoreReference{{StoreName: "prod", Secrets: []*sandboxv1.SecretMapping{{Path: "db/main", Field: "password", EnvVar: "SIDE_SECRET"}}}}},
	}}
	gsb := g.create(t, grp, "")
	g.waitState(t, gsb.GetSandboxId(), sandboxv1.State_STATE_RUNNING)
	for _, c := range []struct {
		name string
		want bool
	}{{"side", true}, {"main", false}} {
		ex, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: gsb.GetSandboxId(), Container: c.name, Command: []string{"env"}}))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(ex.Msg.GetStdout()), "SIDE_SECRET="+value+"\n"); got != c.want {
			t.Fatalf("container %s: secret in env %v, want %v:\n%s", c.name, got, c.want, ex.Msg.GetStdout())
		}
	}

	// Pull credentials from the store: the private image runs with them and not without.
	priv := spec(host+"/org-a/private:v1", "/bin/sh", "-c", `trap "exit 0" TERM; sleep infinity & wait`)
	priv.Containers[0].ImagePullCredentials = &sandboxv1.ImagePullCredentials{Registry: host,
		Credentials: &sandboxv1.SecretSource{StoreName: "prod", Path: "registry"}}
	psb := g.create(t, priv, "")
	g.waitState(t, psb.GetSandboxId(), sandboxv1.State_STATE_RUNNING)
	bare := spec(host+"/org-a/private:v1", "/bin/sh", "-c", `sleep 1`)
	if res, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: bare}})); err == nil {
		g.waitState(t, res.Msg.GetSandboxId(), sandboxv1.State_STATE_FAILED)
	}

	// Nowhere at rest: the runner's data dir (state, specs, agent configs, logs), the
	// gateway's (store, key) and the process logs hold neither value.
	for _, root := range []string{stackDir, gwDir} {
		if hits := grepTree(t, root, value, pullPass); len(hits) > 0 {
			t.Fatalf("a secret value at rest in %v", hits)
		}
	}
	if l := logs.String(); strings.Contains(l, value) || strings.Contains(l, pullPass) {
		t.Fatal("a secret value in the logs")
	}
	// Unknown store: refused with the target's reason.
	bad := spec(busybox(), "/bin/true")
	bad.Containers[0].SecretStores = []*sandboxv1.SecretStoreReference{{StoreName: "nope",
		Secrets: []*sandboxv1.SecretMapping{{Path: "db/main", Field: "password", EnvVar: "X"}}}}
	_, err = g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: bad}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown store: %v", err)
	}
}

// TestSecretEnvWarmPoolAndRestart: a sandbox served from the warm pool gets its secret
// environment with the claim's Start (the config file shows none), and keeps it across a
// runner restart (re-adoption leaves the agent, which holds it in memory, running); the
// data dir never holds the value.
func TestSecretEnvWarmPoolAndRestart(t *testing.T) {
	const value = "e2e-pool-secret-5d1e77"
	dir := t.TempDir()
	s := poolStack(t, dir, 1, time.Minute)
	prime := create(t, s, runner.CreateRequest{Spec: sleeper(busybox())})
	waitState(t, s, prime.ID, runner.StateRunning, 30*time.Second)
	spec := sleeper(busybox())
	spec.SecretEnv = map[string]string{"POOL_SECRET": value}
	sb := createClaimed(t, s, spec)
	waitState(t, s, sb.ID, runner.StateRunning, 30*time.Second)
	if out := string(execIn(t, agentOf(t, s, sb.ID), "env").GetStdout()); !strings.Contains(out, "POOL_SECRET="+value+"\n") {
		t.Fatalf("claimed sandbox's env lacks the secret:\n%s", out)
	}
	if hits := grepTree(t, dir, value); len(hits) > 0 {
		t.Fatalf("the value at rest in %v", hits)
	}
	// The runner restarts and re-adopts the sandbox: the environment is still there.
	s.Close()
	s2 := newStack(t, dir)
	t.Cleanup(func() { finish(t, s2, dir) })
	waitState(t, s2, sb.ID, runner.StateRunning, 30*time.Second)
	if out := string(execIn(t, agentOf(t, s2, sb.ID), "env").GetStdout()); !strings.Contains(out, "POOL_SECRET="+value+"\n") {
		t.Fatalf("after the runner restart the env lacks the secret:\n%s", out)
	}
	if hits := grepTree(t, dir, value); len(hits) > 0 {
		t.Fatalf("the value at rest in %v after the restart", hits)
	}
}
