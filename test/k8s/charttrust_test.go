package k8s

import (
	"context"
	"fmt"
	"maps"
	"os"
	osexec "os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// trustSource is where the rendered runner reads the file of one flag from: the volume
// behind the flag's path (kind ConfigMap or Secret, the object's name and the key mounted
// at that path).
type trustSource struct{ Kind, Name, Key string }

// trustSourceOf follows the runner's flag (--egress-roots, --egress-upstream-ca) of the
// rendered Deployment d to its volume: the arg's file, the read-only mount of its
// directory, the volume's single item at the file's name. nil: no such arg.
func trustSourceOf(t *testing.T, d appsv1.Deployment, flag string) *trustSource {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	var file string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			if file != "" {
				t.Fatalf("%s twice in %q", flag, c.Args)
			}
			file = v
		}
		if a == flag {
			t.Fatalf("%s without a value in %q", flag, c.Args)
		}
	}
	if file == "" {
		return nil
	}
	dir, base := path.Split(file)
	var mounts []corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		if m.MountPath == strings.TrimSuffix(dir, "/") {
			mounts = append(mounts, m)
		}
	}
	if len(mounts) != 1 || !mounts[0].ReadOnly || mounts[0].SubPath != "" {
		t.Fatalf("%s=%s: mounts of %s: %+v, want one read-only mount", flag, file, dir, mounts)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name != mounts[0].Name {
			continue
		}
		var src trustSource
		var items []corev1.KeyToPath
		switch {
		case v.ConfigMap != nil && v.Secret == nil:
			src, items = trustSource{"ConfigMap", v.ConfigMap.Name, ""}, v.ConfigMap.Items
			if v.ConfigMap.Optional != nil && *v.ConfigMap.Optional {
				t.Errorf("%s: volume %s is optional: the runner would start without its file", flag, v.Name)
			}
		case v.Secret != nil && v.ConfigMap == nil:
			src, items = trustSource{"Secret", v.Secret.SecretName, ""}, v.Secret.Items
			if v.Secret.Optional != nil && *v.Secret.Optional {
				t.Errorf("%s: volume %s is optional: the runner would start without its file", flag, v.Name)
			}
		default:
			t.Fatalf("%s: volume %+v: want a ConfigMap or a Secret", flag, v)
		}
		if len(items) != 1 || items[0].Path != base {
			t.Fatalf("%s=%s: volume %s items %+v, want the one key at %s", flag, file, v.Name, items, base)
		}
		src.Key = items[0].Key
		return &src
	}
	t.Fatalf("%s: no volume %s", flag, mounts[0].Name)
	return nil
}

// testCAPEM is a fresh CA certificate in PEM (public: what the values carry).
func testCAPEM(t *testing.T, name string) string {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	return string(ca.CertPEM())
}

// TestChartEgressTrust (issue 23): egress.roots and egress.upstreamCA give the runner
// --egress-roots and --egress-upstream-ca from one source each: inline PEM (rendered into
// the ConfigMap <fullname>-egress-trust, byte for byte, with a checksum annotation on the
// Pod that follows it), or the name and key of an existing ConfigMap or Secret, mounted
// read-only (not optional) at the flag's file. Unset (the default, egress on or off):
// neither flag, volume, ConfigMap nor annotation. Two sources, a source while egress is
// off, a name or key missing or malformed, inline text without a PEM certificate or over
// the runner's 900 KiB, or inline roots and CA over a ConfigMap's size fail the render
// naming the value; helm lint passes with every source.
func TestChartEgressTrust(t *testing.T) {
	helm := chartHelm(t)
	dir := t.TempDir()
	rootsPEM, caPEM := testCAPEM(t, "roots"), testCAPEM(t, "upstream")
	rootsFile, caFile := filepath.Join(dir, "roots.pem"), filepath.Join(dir, "ca.pem")
	for f, s := range map[string]string{rootsFile: rootsPEM, caFile: caPEM} {
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	on := []string{"--set", "egress.enabled=true"}
	const trustCM = "ConfigMap/sandboxd-runner-egress-trust"
	deployment := func(r renderedChart) appsv1.Deployment {
		t.Helper()
		var d appsv1.Deployment
		if !r.get(t, "Deployment/sandboxd-runner", &d) {
			t.Fatalf("no Deployment/sandboxd-runner in %v", r.keys())
		}
		return d
	}
	const checksum = "checksum/egress-trust"

	for _, tc := range []struct {
		name           string
		set            []string
		roots, ca      *trustSource
		data           map[string]string // the rendered ConfigMap's data; nil: none rendered
		noChecksumWant bool
	}{
		{name: "default, egress off"},
		{name: "default, egress on", set: on},
		{name: "roots inline", set: append(slices.Clone(on), "--set-file", "egress.roots.pem="+rootsFile),
			roots: &trustSource{"ConfigMap", "sandboxd-runner-egress-trust", "roots.pem"}, data: map[string]string{"roots.pem": rootsPEM}},
		{name: "roots from a ConfigMap", set: append(slices.Clone(on), "--set", "egress.roots.configMap.name=corp-roots,egress.roots.configMap.key=ca-bundle.crt"),
			roots: &trustSource{"ConfigMap", "corp-roots", "ca-bundle.crt"}},
		{name: "roots from a Secret", set: append(slices.Clone(on), "--set", "egress.roots.secret.name=corp-roots,egress.roots.secret.key=bundle.pem"),
			roots: &trustSource{"Secret", "corp-roots", "bundle.pem"}},
		{name: "upstream CA inline", set: append(slices.Clone(on), "--set-file", "egress.upstreamCA.pem="+caFile),
			ca: &trustSource{"ConfigMap", "sandboxd-runner-egress-trust", "upstream-ca.pem"}, data: map[string]string{"upstream-ca.pem": caPEM}},
		{name: "upstream CA from a ConfigMap", set: append(slices.Clone(on), "--set", "egress.upstreamCA.configMap.name=kube-root-ca.crt,egress.upstreamCA.configMap.key=ca.crt"),
			ca: &trustSource{"ConfigMap", "kube-root-ca.crt", "ca.crt"}},
		{name: "upstream CA from a Secret", set: append(slices.Clone(on), "--set", "egress.upstreamCA.secret.name=corp-ca,egress.upstreamCA.secret.key=ca.crt"),
			ca: &trustSource{"Secret", "corp-ca", "ca.crt"}},
		{name: "both inline", set: append(slices.Clone(on), "--set-file", "egress.roots.pem="+rootsFile, "--set-file", "egress.upstreamCA.pem="+caFile),
			roots: &trustSource{"ConfigMap", "sandboxd-runner-egress-trust", "roots.pem"}, ca: &trustSource{"ConfigMap", "sandboxd-runner-egress-trust", "upstream-ca.pem"},
			data: map[string]string{"roots.pem": rootsPEM, "upstream-ca.pem": caPEM}},
		{name: "roots from a Secret, upstream CA inline", set: append(slices.Clone(on), "--set", "egress.roots.secret.name=corp-roots,egress.roots.secret.key=bundle.pem",
			"--set-file", "egress.upstreamCA.pem="+caFile),
			roots: &trustSource{"Secret", "corp-roots", "bundle.pem"}, ca: &trustSource{"ConfigMap", "sandboxd-runner-egress-trust", "upstream-ca.pem"},
			data: map[string]string{"upstream-ca.pem": caPEM}},
		{name: "a key YAML reads as a boolean", set: append(slices.Clone(on), "--set", "egress.roots.configMap.name=r", "--set-string", "egress.roots.configMap.key=true"),
			roots: &trustSource{"ConfigMap", "r", "true"}},
	} {
		r, err := renderChart(t, helm, "sandboxd-runner", tc.set...)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		d := deployment(r)
		for _, f := range []struct {
			flag string
			want *trustSource
		}{{"--egress-roots", tc.roots}, {"--egress-upstream-ca", tc.ca}} {
			got := trustSourceOf(t, d, f.flag)
			if (got == nil) != (f.want == nil) || got != nil && *got != *f.want {
				t.Errorf("%s: %s from %+v, want %+v", tc.name, f.flag, got, f.want)
			}
		}
		var cm corev1.ConfigMap
		if has := r.get(t, trustCM, &cm); has != (tc.data != nil) {
			t.Errorf("%s: %s rendered %v, want %v", tc.name, trustCM, has, tc.data != nil)
		} else if has && (!maps.Equal(cm.Data, tc.data) || cm.Namespace != "sandboxd" || cm.BinaryData != nil) {
			t.Errorf("%s: ConfigMap namespace %q data %q, want %q", tc.name, cm.Namespace, cm.Data, tc.data)
		}
		if _, has := d.Spec.Template.Annotations[checksum]; has != (tc.data != nil) {
			t.Errorf("%s: Pod annotation %s present %v, want %v (inline PEM only)", tc.name, checksum, has, tc.data != nil)
		}
		// Any source lints.
		if out, err := osexec.Command(helm, append([]string{"lint", "--strict", chartDir}, tc.set...)...).CombinedOutput(); err != nil {
			t.Errorf("%s: helm lint: %v\n%s", tc.name, err, out)
		}
	}

	// The checksum follows the inline PEM: another bundle rolls the runner.
	sum := func(set ...string) string {
		r, err := renderChart(t, helm, "sandboxd-runner", append(slices.Clone(on), set...)...)
		if err != nil {
			t.Fatal(err)
		}
		return deployment(r).Spec.Template.Annotations[checksum]
	}
	other := filepath.Join(dir, "other.pem")
	if err := os.WriteFile(other, []byte(testCAPEM(t, "other")), 0o600); err != nil {
		t.Fatal(err)
	}
	if a, b, c := sum("--set-file", "egress.roots.pem="+rootsFile), sum("--set-file", "egress.roots.pem="+other), sum("--set-file", "egress.upstreamCA.pem="+rootsFile); a == "" || a == b || a == c {
		t.Errorf("checksum/egress-trust: %q for the roots, %q for other roots, %q for the same PEM as upstream CA: want three", a, b, c)
	}

	big := func(name string, n int) string {
		f := filepath.Join(dir, name)
		// A certificate, then comment lines up to n bytes.
		s := rootsPEM + strings.Repeat(strings.Repeat("#", 99)+"\n", (n-len(rootsPEM))/100+1)
		if err := os.WriteFile(f, []byte(s[:n]), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("just text\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const maxPEM = 900 << 10 // kubernetes.MaxEgressRoots
	if _, err := renderChart(t, helm, "sandboxd-runner", append(slices.Clone(on), "--set-file", "egress.roots.pem="+big("max.pem", maxPEM))...); err != nil {
		t.Errorf("inline roots of %d bytes: %v", maxPEM, err)
	}
	for _, bad := range []struct {
		set []string
		err string
	}{
		// Two sources.
		{[]string{"--set-file", "egress.roots.pem=" + rootsFile, "--set", "egress.roots.configMap.name=r,egress.roots.configMap.key=k"},
			"egress.roots: pem and configMap given: want one source of --egress-roots (pem, configMap or secret)"},
		{[]string{"--set", "egress.upstreamCA.configMap.name=r,egress.upstreamCA.configMap.key=k,egress.upstreamCA.secret.name=s,egress.upstreamCA.secret.key=k"},
			"egress.upstreamCA: configMap and secret given: want one source of --egress-upstream-ca"},
		{[]string{"--set-file", "egress.roots.pem=" + rootsFile, "--set", "egress.roots.secret.key=k"}, "egress.roots: pem and secret given"},
		// A name or key missing or malformed.
		{[]string{"--set", "egress.roots.configMap.name=corp-roots"}, `egress.roots.configMap.key: want the key of ConfigMap "corp-roots" that holds the PEM bundle`},
		{[]string{"--set", "egress.upstreamCA.secret.name=corp-ca"}, `egress.upstreamCA.secret.key: want the key of Secret "corp-ca" that holds the PEM bundle`},
		{[]string{"--set", "egress.roots.secret.key=ca.crt"}, `egress.roots.secret.name: want the name of a Secret of the release namespace (key "ca.crt" given)`},
		{[]string{"--set", "egress.roots.configMap.name=Corp_Roots,egress.roots.configMap.key=k"}, `egress.roots.configMap.name "Corp_Roots": want a ConfigMap name`},
		{[]string{"--set", "egress.roots.configMap.name=r,egress.roots.configMap.key=a/b"}, `egress.roots.configMap.key "a/b": want a ConfigMap key`},
		{[]string{"--set", "egress.roots.secret.name=r,egress.roots.secret.key=.."}, `egress.roots.secret.key "..": want a Secret key`},
		{[]string{"--set", "egress.roots.configMap.name=r,egress.roots.configMap.key=1"}, "egress.roots.configMap.key: want a string (--set-string), got 1"},
		// Types.
		{[]string{"--set", "egress.roots=x"}, "egress.roots: want a map (pem, configMap, secret)"},
		{[]string{"--set", "egress.upstreamCA.secret=x"}, "egress.upstreamCA.secret: want a map (name, key)"},
		{[]string{"--set", "egress.roots.pem=1"}, "egress.roots.pem: want PEM text"},
		// Inline text.
		{[]string{"--set-file", "egress.roots.pem=" + notPEM}, "egress.roots.pem: holds no PEM certificate (-----BEGIN CERTIFICATE-----)"},
		{[]string{"--set-file", "egress.upstreamCA.pem=" + notPEM}, "egress.upstreamCA.pem: holds no PEM certificate"},
		{[]string{"--set-file", "egress.roots.pem=" + big("over.pem", maxPEM+1)}, fmt.Sprintf("egress.roots.pem: %d bytes, at most 921600 (900 KiB: the runner's limit for --egress-roots", maxPEM+1)},
		{[]string{"--set-file", "egress.upstreamCA.pem=" + big("c-over.pem", maxPEM+1)}, fmt.Sprintf("egress.upstreamCA.pem: %d bytes, at most 921600 (900 KiB: the chart's ConfigMap holds at most 1 MiB)", maxPEM+1)},
		{[]string{"--set-file", "egress.roots.pem=" + big("r600.pem", 600<<10), "--set-file", "egress.upstreamCA.pem=" + big("c600.pem", 600<<10)},
			"egress.roots.pem and egress.upstreamCA.pem: 1228800 bytes together, at most 1024000 (the ConfigMap sandboxd-runner-egress-trust holds both"},
		// The chart sets the two flags: not in extraArgs too.
		{[]string{"--set-string", "extraArgs[0]=--egress-roots=/etc/ssl/corp.pem"}, `extraArgs: "--egress-roots=/etc/ssl/corp.pem": with egress.enabled the chart sets the runner's --egress-* flags itself`},
	} {
		_, err := renderChart(t, helm, "sandboxd-runner", append(slices.Clone(on), bad.set...)...)
		if err == nil || !strings.Contains(err.Error(), bad.err) {
			t.Errorf("%q: %v, want the render refused with %q", bad.set, err, bad.err)
		}
	}
	// A source while egress is off: the runner would not read it.
	for _, off := range []struct {
		set  []string
		what string
	}{
		{[]string{"--set-file", "egress.roots.pem=" + rootsFile}, "egress.roots.pem given while egress.enabled is false: the runner reads --egress-roots only with its egress proxy"},
		{[]string{"--set", "egress.roots.configMap.name=r,egress.roots.configMap.key=k"}, "egress.roots.configMap given while egress.enabled is false"},
		{[]string{"--set", "egress.upstreamCA.secret.name=s,egress.upstreamCA.secret.key=k"}, "egress.upstreamCA.secret given while egress.enabled is false: the runner reads --egress-upstream-ca only"},
		{[]string{"--set", "egress.upstreamCA.secret.name=s"}, "egress.upstreamCA.secret given while egress.enabled is false"},
	} {
		if _, err := renderChart(t, helm, "sandboxd-runner", off.set...); err == nil || !strings.Contains(err.Error(), off.what) {
			t.Errorf("egress off, %q: %v, want the render refused with %q", off.set, err, off.what)
		}
	}
}

// TestChartEgressRootsOnCluster (issue 23): the chart installed on the test cluster with
// egress on, egress.roots from a ConfigMap of the operator's (two CA certificates under a
// key of its choosing) and egress.upstreamCA from a Secret: the runner Pod becomes Ready
// (it read both PEM files at its start) and writes its roots ConfigMap
// sandboxd-egress-roots-<runner-id> in the sandbox namespace holding exactly that bundle,
// the one sandboxes with egress secrets trust (TestKubernetesEgressSecrets is the
// sandbox's side). No data volume: the runner registers once.
func TestChartEgressRootsOnCluster(t *testing.T) {
	c := needCluster(t)
	helm := needHelm(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const release = "sandboxd-runner"
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := k8s.NewForConfigOrDie(rc)
	cp := startControlPlane(t, ctx, nodeIP(t, ctx, admin), "update-test")
	runnerID := randomID("roots-")
	if _, err := cp.api.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: runnerID, ClusterId: "c-" + runnerID, Zone: "test", Policy: &structpb.Struct{}}})); err != nil {
		t.Fatal(err)
	}
	tok, err := cp.api.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: runnerID}))
	if err != nil {
		t.Fatal(err)
	}

	ns := randomID("sandboxd-roots-")
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	bundle := testCAPEM(t, "corp root A") + testCAPEM(t, "corp root B")
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "corp-roots"},
		Data: map[string]string{"corp-bundle.crt": bundle}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "corp-ca"},
		Data: map[string][]byte{"ca.crt": []byte(testCAPEM(t, "corp upstream CA"))}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	repo, tag, _ := strings.Cut(env("SANDBOXD_K8S_RUNNER_IMAGE", "localhost/sandboxd/runner:dev"), ":")
	agentRepo, agentTag, _ := strings.Cut(c.agentImage, ":")
	install := osexec.CommandContext(ctx, helm, "install", release, chartDir, "--namespace", ns, "--kubeconfig", c.kubeconfig,
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "agentImage.repository="+agentRepo, "--set", "agentImage.tag="+agentTag, "--set", "sandboxImagePullPolicy=Never",
		"--set", "controlPlane.address="+cp.addr, "--set", "controlPlane.bootstrapToken="+tok.Msg.GetBootstrapToken(),
		"--set-file", "controlPlane.caPEM="+cp.caFile, "--set", "persistence.enabled=false",
		"--set", "egress.enabled=true",
		"--set", "egress.roots.configMap.name=corp-roots", "--set", "egress.roots.configMap.key=corp-bundle.crt",
		"--set", "egress.upstreamCA.secret.name=corp-ca", "--set", "egress.upstreamCA.secret.key=ca.crt")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	start := time.Now()
	var pod *corev1.Pod
	for pod == nil {
		pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sandboxd-runner"})
		if err != nil {
			t.Fatal(err)
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; podReady(p) {
				pod = p
			} else if ctx.Err() != nil {
				t.Fatalf("runner Pod %s not Ready: %+v\n%s", p.Name, p.Status.ContainerStatuses, podLog(admin, p))
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("no runner Pod Ready: %v", ctx.Err())
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("runner Pod %s Ready %s after helm install", pod.Name, time.Since(start).Round(time.Millisecond))
	if args := pod.Spec.Containers[0].Args; !slices.Contains(args, "--egress-roots=/etc/sandboxd/egress-roots/roots.pem") ||
		!slices.Contains(args, "--egress-upstream-ca=/etc/sandboxd/egress-upstream-ca/upstream-ca.pem") {
		t.Errorf("runner args %q lack the chart's --egress-roots and --egress-upstream-ca", args)
	}
	name := gate.EgressRootsConfigMapName(runnerID)
	cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the runner's roots ConfigMap %s: %v\n%s", name, err, podLog(admin, pod))
	}
	if got := cm.Data[gate.EgressRootsFile]; got != bundle {
		t.Errorf("ConfigMap %s item %s: %d bytes beginning %.120q, want the operator's bundle (%d bytes)", name, gate.EgressRootsFile, len(got), got, len(bundle))
	}
	if out, err := osexec.Command(helm, "uninstall", release, "--namespace", ns, "--kubeconfig", c.kubeconfig, "--wait").CombinedOutput(); err != nil {
		t.Errorf("helm uninstall: %v\n%s", err, out)
	}
}
