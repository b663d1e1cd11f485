package security

import (
	"context"
	"net"
	"net/netip"
	goruntime "runtime"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// TestK8sForgedHello: a Kubernetes runner takes its sandboxes' gate hellos (UDP, from
// the Pods' network) to dial a creating sandbox's agent early. A sandbox that knows its
// own hello key (the worst case: its gate's) and floods the runner with hellos naming
// another creating sandbox's ID, from its own address, achieves nothing: the victim's
// create sees no hello and the runner dials nobody, and the runner's goroutines do not
// grow. The attacker's own genuine hello is taken (the runner dials it: the path works).
func TestK8sForgedHello(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	helloAddr := pc.LocalAddr().String()
	pc.Close()
	var mu sync.Mutex
	var dials []string
	hellos := map[string]bool{}
	cs := fake.NewSimpleClientset()
	b, err := kubernetes.New(t.Context(), kubernetes.Config{Client: cs, Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1",
		MaxPrepull: -1, HelloListen: helloAddr, HelloAddr: helloAddr,
		Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
			mu.Lock()
			dials = append(dials, addr)
			mu.Unlock()
			return nil, net.ErrClosed
		},
		StepHook: func(id, step string, _ time.Time) {
			if step == kubernetes.StepHello {
				mu.Lock()
				hellos[id] = true
				mu.Unlock()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, id := range []string{"victim", "attacker"} {
		go func() {
			_, _ = b.Create(ctx, &runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"1"}}})
		}()
	}
	// The attacker's own key, as its gate holds it.
	var key []byte
	for end := time.Now().Add(10 * time.Second); key == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the creates made no Secrets")
		}
		v, _ := cs.CoreV1().Secrets("sbx").Get(ctx, "sbx-victim", metav1.GetOptions{})
		a, _ := cs.CoreV1().Secrets("sbx").Get(ctx, "sbx-attacker", metav1.GetOptions{})
		if v != nil && a != nil && len(a.Data[gate.HelloKeyFile]) == gate.HelloKeyLen {
			key = a.Data[gate.HelloKeyFile]
		}
	}
	conn, err := net.Dial("udp", helloAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	self := netip.MustParseAddr("127.0.0.1")
	time.Sleep(100 * time.Millisecond) // the creates reach their wait for the agent
	before := goruntime.NumGoroutine()
	for i := 0; i < 2000; i++ {
		var p []byte
		switch i % 3 {
		case 0: // the victim's ID under the attacker's key
			p, _ = gate.MarshalHello(key, "victim", self, time.Now())
		case 1: // an all-zero key
			p, _ = gate.MarshalHello(make([]byte, gate.HelloKeyLen), "victim", self, time.Now())
		default: // junk of the largest size the runner reads
			p = make([]byte, 256)
		}
		_, _ = conn.Write(p)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	if hellos["victim"] || len(dials) > 0 {
		t.Errorf("forged hellos had an effect: victim's hello taken %v, dials %v", hellos["victim"], dials)
	}
	mu.Unlock()
	if after := goruntime.NumGoroutine(); after > before+5 {
		t.Errorf("goroutines %d -> %d after the flood", before, after)
	}
	// The attacker's genuine hello for itself: taken once its source's rate allows.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		p, _ := gate.MarshalHello(key, "attacker", self, time.Now())
		_, _ = conn.Write(p)
		mu.Lock()
		ok := hellos["attacker"]
		n := len(dials)
		mu.Unlock()
		if ok && n > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the attacker's own hello was not taken (dials %d): the test proves nothing", n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if hellos["victim"] {
		t.Error("the victim's create took a hello")
	}
	for _, d := range dials {
		if d != "127.0.0.1:7443" {
			t.Errorf("dialed %s", d)
		}
	}
}
