package kubernetes

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

const testSecretValue = "tok-VALUE-never-in-an-object-7f3a"

func egressSecretSpec(id string) *runtime.Spec {
	s := hostNameSpec(id, runtime.EgressRule{DNSName: "api.inject.test",
		Secret: &runtime.EgressSecret{Store: "vault", Path: "api", EnvVar: "API_TOKEN", Header: "X-Api-Key"}})
	s.EgressSecretValues = map[string]string{"vault/api": testSecretValue}
	s.Meta = map[string]string{runtime.MetaOrg: "org-e"}
	return s
}

// TestEgressSecretsNoValueInObjects: a Create of a sandbox with an egress secret on a
// runner with Egress puts no value, no placeholder and no CA key into any object the API
// server holds (Pod, Secrets, ConfigMaps, NetworkPolicy) nor into the runner's data
// dirs; the sandbox Secret holds the CA certificate (public) for the gate; the workload
// is held, its CA emptyDir is mounted read-only in every workload container and written
// by the gate alone; the roots ConfigMap holds the configured roots; the proxy's
// lookup for the Pod's address returns secrets that inject the value.
func TestEgressSecretsNoValueInObjects(t *testing.T) {
	e := testEgress()
	e.Roots = testRootsPEM(t, "roots")
	dir := t.TempDir()
	cfg := Config{Egress: e, StartTimeout: time.Second, MaxPrepull: -1, LogDir: filepath.Join(dir, "logs"), SnapshotCacheDir: filepath.Join(dir, "snap")}
	for _, spec := range []*runtime.Spec{egressSecretSpec("sec-1"), func() *runtime.Spec {
		s := egressSecretSpec("sec-2")
		s.Name = "main"
		s.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sleep", Args: []string{"60"}}}
		return s
	}()} {
		t.Run(spec.ID, func(t *testing.T) {
			b, cs := newFakeBackend(t, cfg)
			ctx, cancel := t.Context(), func() {}
			defer cancel()
			errc := make(chan error, 1)
			go func() { _, err := b.Create(ctx, spec); errc <- err }()
			var pod *corev1.Pod
			for range 200 {
				if p, err := cs.CoreV1().Pods("sbx").Get(ctx, podName(spec.ID), metav1.GetOptions{}); err == nil {
					pod = p
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if pod == nil {
				t.Fatalf("no Pod made: %v", <-errc)
			}
			b.mu.Lock()
			s := b.sandboxes[spec.ID]
			b.mu.Unlock()
			if s == nil || s.egress == nil {
				t.Fatal("the sandbox has no egress secrets in memory")
			}
			ph := s.egress.Injections[0].Placeholder
			if !strings.HasPrefix(ph, "sbx-secret-") {
				t.Fatalf("placeholder %q", ph)
			}
			_, keyDER, _, err := s.egress.Export()
			if err != nil {
				t.Fatal(err)
			}
			needles := caKeyNeedles(t, keyDER)
			needles["value"], needles["placeholder"] = []byte(testSecretValue), []byte(ph)

			// Every object the fake API server holds.
			var blobs [][]byte
			add := func(o any) {
				j, err := json.Marshal(o)
				if err != nil {
					t.Fatal(err)
				}
				blobs = append(blobs, j)
			}
			pods, _ := cs.CoreV1().Pods("sbx").List(ctx, metav1.ListOptions{})
			secs, _ := cs.CoreV1().Secrets("sbx").List(ctx, metav1.ListOptions{})
			cms, _ := cs.CoreV1().ConfigMaps("sbx").List(ctx, metav1.ListOptions{})
			nps, _ := cs.NetworkingV1().NetworkPolicies("sbx").List(ctx, metav1.ListOptions{})
			add(pods)
			add(secs)
			add(cms)
			add(nps)
			for _, sec := range secs.Items {
				for _, v := range sec.Data {
					blobs = append(blobs, v) // json base64-encodes Data
				}
			}
			_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					b, _ := os.ReadFile(p)
					blobs = append(blobs, b)
				}
				return nil
			})
			for _, bl := range blobs {
				for what, needle := range needles {
					if bytes.Contains(bl, needle) {
						t.Errorf("the %s is in an API object or a runner file: %.200s", what, bl)
					}
				}
			}
			sec, err := cs.CoreV1().Secrets("sbx").Get(ctx, secretName(spec.ID), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(sec.Data[gate.EgressCAFile], s.egress.CACertPEM()) {
				t.Error("the sandbox Secret lacks the CA certificate for the gate")
			}
			cm, err := cs.CoreV1().ConfigMaps("sbx").Get(ctx, gate.EgressRootsConfigMapName(b.cfg.RunnerID), metav1.GetOptions{})
			if err != nil || cm.Data[gate.EgressRootsFile] != string(e.Roots) {
				t.Errorf("roots ConfigMap: %v %+v", err, cm)
			}
			// Held: the in-Pod configs carry no command and no environment.
			for k, v := range sec.Data {
				if strings.HasSuffix(k, ".json") && k != secretSpec {
					var c agentconfig.Config
					if json.Unmarshal(v, &c) == nil && (len(c.Argv) > 0 || len(c.Env) > 0) && !c.Standby {
						t.Errorf("config %s is not held: %+v", k, c)
					}
				}
			}
			// The CA dir: written by the gate, read-only everywhere else.
			workloads := 0
			for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
				var m *corev1.VolumeMount
				for i := range c.VolumeMounts {
					if c.VolumeMounts[i].Name == "egress-ca" {
						m = &c.VolumeMounts[i]
					}
				}
				if c.Name == containerGate {
					if m == nil || m.MountPath != gate.EgressDir || m.ReadOnly {
						t.Errorf("gate: CA dir mount %+v", m)
					}
					continue
				}
				workloads++
				if m == nil || m.MountPath != egress.CAMount || !m.ReadOnly {
					t.Errorf("container %s: CA mount %+v, want read-only at %s", c.Name, m, egress.CAMount)
				}
				for _, vm := range c.VolumeMounts {
					if vm.Name == "egress-src" {
						t.Errorf("container %s mounts the gate's egress sources", c.Name)
					}
				}
			}
			if want := 1 + len(spec.Sidecars); workloads != want {
				t.Errorf("%d workload containers, want %d", workloads, want)
			}
			// The proxy's view once the Pod runs at an address.
			ip := netip.MustParseAddr("10.244.0.9")
			p := pod.DeepCopy()
			b.mu.Lock()
			s.uid = "u-" + types.UID(spec.ID) // the fake API server sets none
			b.mu.Unlock()
			p.UID = s.uid
			p.Status.Phase, p.Status.PodIP, p.Status.PodIPs = corev1.PodRunning, ip.String(), []corev1.PodIP{{IP: ip.String()}}
			b.observe(p, false)
			if ss := b.EgressSecrets(ip); ss != s.egress || ss.Lost {
				t.Errorf("EgressSecrets of the Pod's address: %p, want the sandbox's %p", ss, s.egress)
			}
			if ss := b.EgressSecrets(netip.MustParseAddr("10.244.0.10")); ss != nil {
				t.Error("secrets for an unknown address")
			}
			if s.egress.Injections[0].Value != testSecretValue || s.egress.Injections[0].Header != "X-Api-Key" {
				t.Errorf("injection %+v", s.egress.Injections[0])
			}
		})
	}
}

// TestEgressSecretsLostOnRecover: a sandbox with egress secrets that a restarted
// runner recovers (the real Recover, from the Pod and Secret another Backend made on the
// same cluster: no values, no CA) is served, at its address once the Pod runs, secrets
// that refuse its injection hosts (Lost), as on a local runner, and its grants.
func TestEgressSecretsLostOnRecover(t *testing.T) {
	cfg := Config{Egress: testEgress(), MaxPrepull: -1, StartTimeout: time.Minute}
	b1, cs := newFakeBackend(t, cfg)
	spec := egressSecretSpec("rec-1")
	go func() { _, _ = b1.Create(t.Context(), spec) }()
	waitFor(t, "the first runner's Pod", func() bool {
		_, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(spec.ID), metav1.GetOptions{})
		return err == nil
	})
	// The fake API server sets no UID; Recover and the registry key on it.
	p0, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(spec.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p0.UID = "u-rec-1"
	if _, err := cs.CoreV1().Pods("sbx").Update(t.Context(), p0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg.Client, cfg.Namespace, cfg.RunnerID, cfg.AgentImage, cfg.PlatformRegistry = cs, "sbx", b1.cfg.RunnerID, b1.cfg.AgentImage, b1.cfg.PlatformRegistry
	b2, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	recs, err := b2.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(recs, func(r runtime.Recovered) bool { return r.Spec.ID == spec.ID }) {
		t.Fatalf("recovered %d sandboxes, not %s", len(recs), spec.ID)
	}
	ip := netip.MustParseAddr("10.244.0.11")
	pod, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(spec.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase, pod.Status.PodIP, pod.Status.PodIPs = corev1.PodRunning, ip.String(), []corev1.PodIP{{IP: ip.String()}}
	if _, err := cs.CoreV1().Pods("sbx").UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the recovered Pod's address registered", func() bool { return b2.EgressSecrets(ip) != nil })
	ss := b2.EgressSecrets(ip)
	if !ss.Lost {
		t.Fatalf("recovered sandbox: secrets %+v, want Lost", ss)
	}
	if g := b2.EgressGrants(ip); !slices.Equal(g, []string{"api.inject.test"}) {
		t.Errorf("grants %q", g)
	}
}

// caKeyNeedles are the forms a P-256 key (PKCS#8 DER) could leak in: its 32-byte scalar
// D raw, in hex and in base64 at each of the 3 byte alignments (the characters that
// depend on D alone), the full base64 of its PKCS#8 and SEC1 DER, the DER itself, and
// each PEM body line after the first (the first is a prefix every P-256 key shares).
func caKeyNeedles(t *testing.T, pkcs8 []byte) map[string][]byte {
	t.Helper()
	k, err := x509.ParsePKCS8PrivateKey(pkcs8)
	if err != nil {
		t.Fatal(err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		t.Fatalf("CA key %T", k)
	}
	d, err := key.Bytes()
	if err != nil || len(d) != 32 {
		t.Fatalf("the key's scalar: %d bytes, %v", len(d), err)
	}
	sec1, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string][]byte{
		"CA key D": d, "CA key D (hex)": []byte(hex.EncodeToString(d)), "CA key D (HEX)": []byte(strings.ToUpper(hex.EncodeToString(d))),
		"CA key (PKCS#8 DER)": pkcs8, "CA key (SEC1 DER)": sec1,
		"CA key (PKCS#8 base64)": []byte(base64.StdEncoding.EncodeToString(pkcs8)),
		"CA key (SEC1 base64)":   []byte(base64.StdEncoding.EncodeToString(sec1)),
	}
	for o := range 3 {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			b := enc.EncodeToString(append(make([]byte, o), d...))
			from, to := 0, len(b)
			if o > 0 {
				from = 4 // the first group mixes in the bytes before D
			}
			if (o+len(d))%3 != 0 {
				to -= 4 // the last group mixes in the bytes after D
			}
			n[fmt.Sprintf("CA key D (base64 at %d, %p)", o, enc)] = []byte(b[from:to])
		}
	}
	for _, blk := range []*pem.Block{{Type: "PRIVATE KEY", Bytes: pkcs8}, {Type: "EC PRIVATE KEY", Bytes: sec1}} {
		lines := strings.Split(strings.TrimSpace(string(pem.EncodeToMemory(blk))), "\n")
		for i, l := range lines[2 : len(lines)-1] { // after the header and the first body line
			if len(l) >= 16 {
				n[fmt.Sprintf("CA key (%s PEM line %d)", blk.Type, i+2)] = []byte(l)
			}
		}
	}
	return n
}
