package k8s

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"sigs.k8s.io/yaml"

	"github.com/sandboxd/sandboxd/internal/stack"
)

// The Kubernetes peer: kubernetes-sigs/agent-sandbox, what a user would pick instead of
// our Kubernetes runner. scripts/build-agent-sandbox.sh builds its controller from the Go
// module proxy and copies the CRDs its module ships into
// $SANDBOXD_CACHE/agent-sandbox/<version>/ ($SANDBOXD_AGENT_SANDBOX_DIR overrides); the
// benchmark installs the CRDs on the test cluster, runs the controller on this host
// against the cluster's API server (admin kubeconfig, extensions on, no leader election,
// no metrics or probe listeners) and drives it as its own Go client does: a SandboxClaim
// on a SandboxWarmPool of a SandboxTemplate, the claim's status names the Sandbox, the
// Sandbox's Ready condition, then `true` exec'd in its Pod through the API server
// (pods/exec, WebSocket with SPDY fallback, as kubectl does).
const agentSandboxVersion = "v1.0.1"

var (
	gvrCRD      = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	gvrSandbox  = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	gvrClaim    = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	gvrTemplate = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}
	gvrPool     = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
)

// errPeerNotBuilt: the controller or its CRDs are not in the cache (the build script has
// not run, or failed): the benchmark says so and skips the peer's line.
var errPeerNotBuilt = errors.New("not built")

func agentSandboxDir() string {
	if d := os.Getenv("SANDBOXD_AGENT_SANDBOX_DIR"); d != "" {
		return d
	}
	return filepath.Join(env("SANDBOXD_CACHE", "/var/cache/sandboxd"), "agent-sandbox", agentSandboxVersion)
}

// agentSandboxBuild is the controller binary and the CRD files of the cached build, or
// errPeerNotBuilt.
func agentSandboxBuild(dir string) (string, []string, error) {
	bin := filepath.Join(dir, "agent-sandbox")
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		return "", nil, fmt.Errorf("%w: no controller at %s (bash scripts/build-agent-sandbox.sh)", errPeerNotBuilt, bin)
	}
	crds, _ := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if len(crds) == 0 {
		return "", nil, fmt.Errorf("%w: no CRDs in %s/crds (bash scripts/build-agent-sandbox.sh)", errPeerNotBuilt, dir)
	}
	sort.Strings(crds)
	return bin, crds, nil
}

// agentSandbox is the peer installed on the cluster: its CRDs, its controller (a process
// of this test) and one SandboxTemplate with two warm pools, each made when first
// measured: "cold" (replicas 0: every claim creates its Sandbox from the template) and
// "warm" (replicas 1: a claim adopts a ready Sandbox, the pool refills).
type agentSandbox struct {
	rc       *rest.Config
	dyn      dynamic.Interface
	cs       k8sclient.Interface
	ns, name string // name: the template's and the pools' prefix; a label on every Pod
	failed   bool   // a measurement failed: the controller's log is shown at cleanup
}

const benchLabel = "sandboxd.dev/bench"

// startAgentSandbox installs the peer, or returns why not (errPeerNotBuilt, or a failure
// to install or start it). Everything it made is removed at cleanup.
func startAgentSandbox(b *testing.B, c cluster) (*agentSandbox, error) {
	b.Helper()
	bin, crds, err := agentSandboxBuild(agentSandboxDir())
	if err != nil {
		return nil, err
	}
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = 100, 200
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	cs, err := k8sclient.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := (&agentSandbox{dyn: dyn}).installCRDs(ctx, crds); err != nil {
		return nil, err
	}
	logf := filepath.Join(b.TempDir(), "agent-sandbox.log")
	lf, err := os.Create(logf)
	if err != nil {
		return nil, err
	}
	cmd := osexec.Command(bin, "--extensions", "--leader-elect=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	exited := make(chan struct{}) // closed when the controller has exited, waitErr set
	var waitErr error
	go func() { waitErr = cmd.Wait(); lf.Close(); close(exited) }()
	// Registered first, so it runs last: the controller outlives the deletes below and
	// takes the Sandboxes' Pods down.
	p := &agentSandbox{rc: rc, dyn: dyn, cs: cs, ns: c.namespace, name: randomID("asb-")}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if b.Failed() || p.failed {
			tail, _ := os.ReadFile(logf)
			if len(tail) > 8192 {
				tail = tail[len(tail)-8192:]
			}
			b.Logf("agent-sandbox controller log (tail):\n%s", tail)
		}
	})
	b.Cleanup(p.cleanup)
	if err := p.create(ctx, gvrTemplate, p.template()); err != nil {
		return nil, err
	}
	select {
	case <-exited:
		p.failed = true
		return nil, fmt.Errorf("agent-sandbox controller exited: %w", waitErr)
	case <-time.After(100 * time.Millisecond):
	}
	return p, nil
}

// crdObjects reads the CustomResourceDefinitions in files.
func crdObjects(files []string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if u := (&unstructured.Unstructured{Object: obj}); len(obj) > 0 && u.GetKind() == "CustomResourceDefinition" {
				out = append(out, u)
			}
		}
	}
	return out, nil
}

// installCRDs applies the module's CRDs (server-side apply) and waits until each is
// Established.
func (p *agentSandbox) installCRDs(ctx context.Context, files []string) error {
	crds, err := crdObjects(files)
	if err != nil {
		return err
	}
	var names []string
	for _, u := range crds {
		body, err := u.MarshalJSON()
		if err != nil {
			return err
		}
		force := true
		if _, err := p.dyn.Resource(gvrCRD).Patch(ctx, u.GetName(), types.ApplyPatchType, body,
			metav1.PatchOptions{FieldManager: "sandboxd-bench", Force: &force}); err != nil {
			return fmt.Errorf("apply CRD %s: %w", u.GetName(), err)
		}
		names = append(names, u.GetName())
	}
	for _, n := range names {
		if err := waitFor(ctx, func() (bool, error) {
			u, err := p.dyn.Resource(gvrCRD).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return condTrue(u, "Established"), nil
		}); err != nil {
			return fmt.Errorf("CRD %s not Established: %w", n, err)
		}
	}
	return nil
}

func (p *agentSandbox) template() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
		"kind":       "SandboxTemplate",
		"metadata":   map[string]any{"name": p.name, "namespace": p.ns},
		"spec": map[string]any{
			"podTemplate": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{benchLabel: p.name}},
				"spec": map[string]any{
					// busybox's sleep as PID 1 ignores SIGTERM: 1 s, not the default 30.
					"terminationGracePeriodSeconds": int64(1),
					"containers": []any{map[string]any{
						"name":            "main",
						"image":           busybox,
						"imagePullPolicy": string(corev1.PullNever), // test/k8s/up.sh imported it
						"command":         []any{"sleep", "3600"},
					}},
				},
			},
		},
	}}
}

var poolReplicas = map[string]int64{"cold": 0, "warm": 1}

func (p *agentSandbox) pool(kind string) *unstructured.Unstructured {
	replicas := poolReplicas[kind]
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
		"kind":       "SandboxWarmPool",
		"metadata":   map[string]any{"name": p.name + "-" + kind, "namespace": p.ns},
		"spec": map[string]any{
			"replicas":           replicas,
			"sandboxTemplateRef": map[string]any{"name": p.name},
		},
	}}
}

func (p *agentSandbox) create(ctx context.Context, gvr schema.GroupVersionResource, u *unstructured.Unstructured) error {
	if _, err := p.dyn.Resource(gvr).Namespace(p.ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return nil
}

// cleanup deletes the claims, pools and template this run made and waits (bounded) for
// their Pods to go.
func (p *agentSandbox) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: benchLabel + "=" + p.name}
	_ = p.dyn.Resource(gvrClaim).Namespace(p.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
	for _, kind := range []string{"cold", "warm"} {
		_ = p.dyn.Resource(gvrPool).Namespace(p.ns).Delete(ctx, p.name+"-"+kind, metav1.DeleteOptions{})
	}
	_ = p.dyn.Resource(gvrTemplate).Namespace(p.ns).Delete(ctx, p.name, metav1.DeleteOptions{})
	_ = waitFor(ctx, func() (bool, error) {
		pods, err := p.cs.CoreV1().Pods(p.ns).List(ctx, sel)
		return err == nil && len(pods.Items) == 0, nil
	})
}

// waitReady waits until the pool's Sandboxes are all ready (not measured).
func (p *agentSandbox) waitReady(ctx context.Context, kind string) error {
	return waitFor(ctx, func() (bool, error) {
		u, err := p.dyn.Resource(gvrPool).Namespace(p.ns).Get(ctx, p.name+"-"+kind, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		want, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
		ready, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		return ready >= want, nil
	})
}

// claim is one claim → first command: the SandboxClaim created, its status naming a
// Sandbox (watched), the Sandbox Ready (watched), `true` exec'd in its Pod. It returns
// the time taken and deletes the claim, waiting (not measured) for the Pod to go.
func (p *agentSandbox) claim(ctx context.Context, kind string) (time.Duration, error) {
	name := randomID(p.name + "-c-")
	claim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
		"kind":       "SandboxClaim",
		"metadata":   map[string]any{"name": name, "namespace": p.ns, "labels": map[string]any{benchLabel: p.name}},
		"spec":       map[string]any{"warmPoolRef": map[string]any{"name": p.name + "-" + kind}},
	}}
	t0 := time.Now()
	if err := p.create(ctx, gvrClaim, claim); err != nil {
		return 0, err
	}
	var sbName string
	err := p.watchUntil(ctx, gvrClaim, name, func(u *unstructured.Unstructured) bool {
		sbName, _, _ = unstructured.NestedString(u.Object, "status", "sandbox", "name")
		return sbName != ""
	})
	var pod string
	if err == nil {
		err = p.watchUntil(ctx, gvrSandbox, sbName, func(u *unstructured.Unstructured) bool {
			pod = u.GetAnnotations()["agents.x-k8s.io/pod-name"]
			if pod == "" {
				pod = u.GetName()
			}
			return condTrue(u, "Ready")
		})
	}
	if err == nil {
		err = p.exec(ctx, pod, "true")
	}
	d := time.Since(t0)
	_ = p.dyn.Resource(gvrClaim).Namespace(p.ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil {
		return 0, fmt.Errorf("claim %s (%s pool): %w", name, kind, err)
	}
	// The claim's Sandbox and Pod go (garbage collector, controller); wait for the Pod so
	// that its teardown does not overlap the next measurement (as ttfc waits for ours).
	if werr := waitFor(ctx, func() (bool, error) {
		_, err := p.cs.CoreV1().Pods(p.ns).Get(ctx, pod, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); werr != nil {
		return 0, fmt.Errorf("pod %s of claim %s not gone: %w", pod, name, werr)
	}
	return d, nil
}

// watchUntil watches the named object (the watch starts with its current state) until ok.
func (p *agentSandbox) watchUntil(ctx context.Context, gvr schema.GroupVersionResource, name string, ok func(*unstructured.Unstructured) bool) error {
	for {
		w, err := p.dyn.Resource(gvr).Namespace(p.ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if u, isU := ev.Object.(*unstructured.Unstructured); isU && ok(u) {
				w.Stop()
				return nil
			}
		}
		w.Stop()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s %s: %w", gvr.Resource, name, err)
		}
	}
}

// exec runs cmd in the Pod's container through the API server, as kubectl exec does.
func (p *agentSandbox) exec(ctx context.Context, pod string, cmd ...string) error {
	req := p.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(p.rc, "GET", req.URL().String())
	if err != nil {
		return err
	}
	spdy, err := remotecommand.NewSPDYExecutor(p.rc, "POST", req.URL())
	if err != nil {
		return err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard, Stderr: io.Discard})
}

// ttfcAgentSandbox is ttfc for the peer: n claims one after the other on the pool of
// kind (after one unmeasured warm-up), each after the pool is ready again.
func ttfcAgentSandbox(p *agentSandbox, kind string, n int) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err := p.create(ctx, gvrPool, p.pool(kind))
	cancel()
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	for i := -1; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := p.waitReady(ctx, kind)
		if err == nil {
			jitterSleep() // as ttfc: sample the kubelet's relist phase
			var d time.Duration
			d, err = p.claim(ctx, kind)
			if i >= 0 {
				out = append(out, d)
			}
		}
		cancel()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func condTrue(u *unstructured.Unstructured, typ string) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ && m["status"] == "True" {
			return true
		}
	}
	return false
}

// waitFor polls cond every 50 ms until it holds, fails, or ctx ends.
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestAgentSandboxCRDs (no cluster; skipped unless the peer is built, or with -short):
// the CRDs the cached agent-sandbox module ships are the four the benchmark drives, served
// at v1beta1, with the fields it sets (a claim's spec.warmPoolRef, a pool's replicas
// allowing 0 and its sandboxTemplateRef, a template's podTemplate).
func TestAgentSandboxCRDs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: unit tier")
	}
	_, files, err := agentSandboxBuild(agentSandboxDir())
	if err != nil {
		t.Skip(err)
	}
	crds, err := crdObjects(files)
	if err != nil {
		t.Fatal(err)
	}
	schemas := map[string]map[string]any{}
	for _, u := range crds {
		versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
		for _, v := range versions {
			m, _ := v.(map[string]any)
			if m["name"] == "v1beta1" && m["served"] == true {
				s, _, _ := unstructured.NestedMap(m, "schema", "openAPIV3Schema", "properties", "spec", "properties")
				schemas[u.GetName()] = s
			}
		}
	}
	for _, gvr := range []schema.GroupVersionResource{gvrSandbox, gvrClaim, gvrTemplate, gvrPool} {
		if _, ok := schemas[gvr.Resource+"."+gvr.Group]; !ok {
			t.Errorf("no served v1beta1 CRD %s.%s in %v", gvr.Resource, gvr.Group, files)
		}
	}
	has := func(crd string, path ...string) {
		t.Helper()
		if _, ok, _ := unstructured.NestedFieldNoCopy(schemas[crd], path...); !ok {
			t.Errorf("%s: no spec field %s", crd, strings.Join(path, "."))
		}
	}
	has("sandboxclaims.extensions.agents.x-k8s.io", "warmPoolRef", "properties", "name")
	has("sandboxwarmpools.extensions.agents.x-k8s.io", "sandboxTemplateRef", "properties", "name")
	has("sandboxtemplates.extensions.agents.x-k8s.io", "podTemplate", "properties", "spec")
	if minimum, ok, _ := unstructured.NestedFieldNoCopy(schemas["sandboxwarmpools.extensions.agents.x-k8s.io"], "replicas", "minimum"); !ok || fmt.Sprint(minimum) != "0" {
		t.Errorf("sandboxwarmpools: replicas minimum %v, want 0 (the cold pool)", minimum)
	}
}
