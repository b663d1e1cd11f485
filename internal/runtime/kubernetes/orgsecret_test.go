package kubernetes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

const testRegistry = "reg.example:5000"

// testToken builds a platform token as registry.MintPullToken lays it out (the MAC is
// not checked by the runner).
func testToken(org, scope string, exp time.Time) string {
	payload := strings.Join([]string{"v1", org, scope, strconv.FormatInt(exp.Unix(), 10)}, "|")
	return "sbxreg." + base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." + base64.RawURLEncoding.EncodeToString([]byte("mac-not-checked-here-0123456789ab"))
}

func testCreds(org string, exp time.Time) *runtime.Credentials {
	return &runtime.Credentials{Username: "sandboxd", Password: testToken(org, "pull", exp)}
}

// newFakeBackend is a Backend on a fake clientset (objects preloaded).
func newFakeBackend(t *testing.T, cfg Config, objs ...k8sruntime.Object) (*Backend, *fake.Clientset) {
	t.Helper()
	cs := fake.NewSimpleClientset(objs...)
	return backendOn(t, cfg, cs), cs
}

// backendOn is a Backend (New, closed with the test) on the fake API server cs, as
// newFakeBackend makes it: a second one on the same cs is a restarted runner.
func backendOn(t *testing.T, cfg Config, cs *fake.Clientset) *Backend {
	t.Helper()
	cfg.Client = cs
	if cfg.Namespace == "" {
		cfg.Namespace = "sbx"
	}
	if cfg.RunnerID == "" {
		cfg.RunnerID = "r1"
	}
	if cfg.AgentImage == "" {
		cfg.AgentImage = "agent:1"
	}
	if cfg.PlatformRegistry == "" {
		cfg.PlatformRegistry = testRegistry
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	b, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

func TestParsePlatformPullToken(t *testing.T) {
	exp := time.Unix(2000000000, 0)
	if tok, ok := parsePlatformPullToken(testToken("org-a", "pull", exp)); !ok || tok.org != "org-a" || !tok.expiry.Equal(exp) {
		t.Errorf("pull token: %+v %v", tok, ok)
	}
	for _, bad := range []string{
		testToken("org-a", "pull,push", exp), // a push token is never shared
		"sbx_apikey_abcdef",                  // an API key
		"sbxreg.!!!.x",
		"sbxreg." + base64.RawURLEncoding.EncodeToString([]byte("v2|org-a|pull|1")) + ".m",
		"sbxreg." + base64.RawURLEncoding.EncodeToString([]byte("v1||pull|1")) + ".m",
		"sbxreg." + strings.Repeat("A", 600),
		"",
	} {
		if _, ok := parsePlatformPullToken(bad); ok {
			t.Errorf("%.40q parsed as a pull token", bad)
		}
	}
}

func TestOrgPullSecretName(t *testing.T) {
	a, b := OrgPullSecretName("r1", "org-a"), OrgPullSecretName("r1", "org-b")
	if a == b || a != OrgPullSecretName("r1", "org-a") || a == OrgPullSecretName("r2", "org-a") {
		t.Errorf("names: %s %s", a, b)
	}
	// Any ID gives a valid name (no "/" or "_" from the ID).
	for _, org := range []string{"Org_With/Odd..Chars", strings.Repeat("x", 256)} {
		n := OrgPullSecretName("r1", org)
		if len(n) != len(a) || strings.ContainsAny(n, "/_.") {
			t.Errorf("%q: %s", org, n)
		}
	}
}

// TestSplitPullCreds: only the sandbox organization's pull token for the platform
// registry goes to the organization's Secret; a caller's own credentials, another
// organization's token and any credentials for another registry stay with the sandbox.
func TestSplitPullCreds(t *testing.T) {
	b := &Backend{cfg: Config{PlatformRegistry: testRegistry}}
	exp := time.Now().Add(15 * time.Minute)
	own := &runtime.Credentials{Username: "u", Password: "p"}
	apiKey := &runtime.Credentials{Username: "sandboxd", Password: "sbx_key"}
	spec := &runtime.Spec{ID: "s1", Meta: map[string]string{runtime.MetaOrg: "org-a"},
		Container: runtime.Container{Image: testRegistry + "/org-a/app:1", PullCredentials: testCreds("org-a", exp)},
		Sidecars: []runtime.Container{
			{Name: "other", Image: "ghcr.io/x/y:1", PullCredentials: own},
			{Name: "newer", Image: testRegistry + "/org-a/db:1", PullCredentials: testCreds("org-a", exp.Add(time.Minute))},
			{Name: "key", Image: testRegistry + "/org-a/key:1", PullCredentials: apiKey},
		},
		InitContainers: []runtime.Container{{Name: "foreign", Image: testRegistry + "/org-b/x:1", PullCredentials: testCreds("org-b", exp)}},
	}
	p, rest := b.splitPullCreds(spec)
	if p == nil || p.org != "org-a" || !p.expiry.Equal(time.Unix(exp.Add(time.Minute).Unix(), 0)) || p.host != testRegistry {
		t.Fatalf("org pull %+v", p)
	}
	if rest.Container.PullCredentials != nil || rest.Sidecars[1].PullCredentials != nil {
		t.Error("org tokens left in the sandbox's own secret")
	}
	if rest.Sidecars[0].PullCredentials != own || rest.Sidecars[2].PullCredentials != apiKey || rest.InitContainers[0].PullCredentials == nil {
		t.Error("other credentials taken out of the sandbox's own secret")
	}
	if spec.Container.PullCredentials == nil || spec.Sidecars[1].PullCredentials == nil {
		t.Error("the spec was changed")
	}
	// No organization, or a token of another organization: nothing shared.
	for _, org := range []string{"", "org-b"} {
		s := &runtime.Spec{ID: "s2", Meta: map[string]string{runtime.MetaOrg: org},
			Container: runtime.Container{Image: testRegistry + "/org-a/app:1", PullCredentials: testCreds("org-a", exp)}}
		if p, rest := b.splitPullCreds(s); p != nil || rest.Container.PullCredentials == nil {
			t.Errorf("org %q: %+v", org, p)
		}
	}
	// Without a platform registry nothing is one.
	b.cfg.PlatformRegistry = ""
	if p, _ := b.splitPullCreds(spec); p != nil {
		t.Errorf("no platform registry: %+v", p)
	}
}

// TestOrgSecretLifecycle: one Secret per organization (and runner), holding the token;
// refreshed only by a token that expires at least orgTokenRefresh later; a Secret of the
// name that is not the organization's is refused, never overwritten; deleted when the
// organization has no sandbox left.
func TestOrgSecretLifecycle(t *testing.T) {
	b, cs := newFakeBackend(t, Config{})
	ctx := t.Context()
	secrets := cs.CoreV1().Secrets("sbx")
	exp := time.Now().Add(15 * time.Minute).Truncate(time.Second)
	pa := &orgPull{org: "org-a", host: testRegistry, creds: *testCreds("org-a", exp), expiry: exp}
	na, err := b.ensureOrgSecret(ctx, pa)
	if err != nil || na != OrgPullSecretName("r1", "org-a") {
		t.Fatal(na, err)
	}
	tokenOf := func(n string) string {
		t.Helper()
		sec, err := secrets.Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var dc struct {
			Auths map[string]struct{ Username, Password string }
		}
		if err := json.Unmarshal(sec.Data[corev1.DockerConfigJsonKey], &dc); err != nil || len(dc.Auths) != 1 || sec.Type != corev1.SecretTypeDockerConfigJson {
			t.Fatalf("secret %s: %v %v", n, dc, err)
		}
		if sec.Annotations[AnnotationOrg] == "" || sec.Labels[LabelKind] != KindOrgPull || sec.Labels[LabelRunner] != "r1" {
			t.Errorf("secret %s: labels %v annotations %v", n, sec.Labels, sec.Annotations)
		}
		return dc.Auths[testRegistry].Password
	}
	if tokenOf(na) != pa.creds.Password {
		t.Error("org-a's secret does not hold its token")
	}
	// A token only 30 s newer: not written.
	p2 := &orgPull{org: "org-a", host: testRegistry, creds: *testCreds("org-a", exp.Add(30*time.Second)), expiry: exp.Add(30 * time.Second)}
	if _, err := b.ensureOrgSecret(ctx, p2); err != nil {
		t.Fatal(err)
	}
	if tokenOf(na) != pa.creds.Password {
		t.Error("rewritten by a token only 30 s newer")
	}
	p3 := &orgPull{org: "org-a", host: testRegistry, creds: *testCreds("org-a", exp.Add(2*time.Minute)), expiry: exp.Add(2 * time.Minute)}
	if _, err := b.ensureOrgSecret(ctx, p3); err != nil {
		t.Fatal(err)
	}
	if tokenOf(na) != p3.creds.Password {
		t.Error("not refreshed by a token 2 min newer")
	}
	// Another organization: another Secret.
	pb := &orgPull{org: "org-b", host: testRegistry, creds: *testCreds("org-b", exp), expiry: exp}
	nb, err := b.ensureOrgSecret(ctx, pb)
	if err != nil || nb == na || tokenOf(nb) != pb.creds.Password || tokenOf(na) != p3.creds.Password {
		t.Fatalf("org-b: %s %v", nb, err)
	}

	// A Secret of org-c's name that says it is someone else's is refused, untouched.
	nc := OrgPullSecretName("r1", "org-c")
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: nc, Namespace: "sbx",
		Labels:      map[string]string{LabelManagedBy: ManagedBy, LabelRunner: "r1", LabelKind: KindOrgPull},
		Annotations: map[string]string{AnnotationOrg: "org-x"}}, Data: map[string][]byte{"k": []byte("v")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pc := &orgPull{org: "org-c", host: testRegistry, creds: *testCreds("org-c", exp), expiry: exp}
	if _, err := b.ensureOrgSecret(ctx, pc); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Errorf("foreign secret: %v", err)
	}
	if sec, _ := secrets.Get(ctx, nc, metav1.GetOptions{}); string(sec.Data["k"]) != "v" {
		t.Error("foreign secret overwritten")
	}

	// GC: kept while a sandbox of the organization is known, deleted after.
	b.mu.Lock()
	b.sandboxes["s1"] = &sandbox{id: "s1", spec: runtime.Spec{ID: "s1", Meta: map[string]string{runtime.MetaOrg: "org-a"}}}
	b.mu.Unlock()
	b.gcOrgSecret(ctx, "org-a")
	if _, err := secrets.Get(ctx, na, metav1.GetOptions{}); err != nil {
		t.Errorf("org-a's secret gone with a sandbox left: %v", err)
	}
	b.gcOrgSecret(ctx, "org-b")
	if _, err := secrets.Get(ctx, nb, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("org-b's secret without sandboxes: %v", err)
	}
	// Destroy of the last sandbox collects it.
	b.mu.Lock()
	b.sandboxes["s1"].changed, b.sandboxes["s1"].done = make(chan struct{}), make(chan struct{})
	b.mu.Unlock()
	if err := b.Destroy(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Get(ctx, na, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("org-a's secret after its last sandbox: %v", err)
	}
	// The sweep after a restart leaves the foreign-looking Secret alone and collects ours.
	if _, err := b.ensureOrgSecret(ctx, pb); err != nil {
		t.Fatal(err)
	}
	b.sweepOrgSecrets(ctx)
	if _, err := secrets.Get(ctx, nb, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("sweep left org-b's secret: %v", err)
	}
	if _, err := secrets.Get(ctx, nc, metav1.GetOptions{}); err != nil {
		t.Errorf("sweep deleted a secret it did not make: %v", err)
	}
}

// TestPodPullSecrets: the Pod names the organization's Secret and the sandbox's own.
func TestPodPullSecrets(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", ImagePullPolicy: corev1.PullIfNotPresent, TerminationGrace: 10e9}}
	spec := &runtime.Spec{ID: "s1", Container: runtime.Container{Image: "busybox", Command: "true"},
		Pod: &runtime.PodSettings{ImagePullSecrets: []string{"operator"}}}
	pod := b.podFor(spec, "", b.labels(spec), []string{OrgPullSecretName("r1", "org-a"), pullSecretName("s1")}, nil)
	var got []string
	for _, r := range pod.Spec.ImagePullSecrets {
		got = append(got, r.Name)
	}
	if want := []string{OrgPullSecretName("r1", "org-a"), pullSecretName("s1"), "operator"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("imagePullSecrets %v, want %v", got, want)
	}
}
