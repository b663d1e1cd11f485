package multicluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/testbed"
)

// TestEndpointsOnRegisteredRunner: a runner registered with the control plane publishes
// endpoints with a certificate the control plane signed, checks TOKEN keys with it, and
// placement sends sandboxes with endpoints only to runners that have an edge.
func TestEndpointsOnRegisteredRunner(t *testing.T) {
	b := startBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := b.Sandboxes(0)
	public := sandboxv1.Visibility_VISIBILITY_PUBLIC
	sp := &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: "python:3.11", Command: "/bin/sh",
			Args: []string{"-c", "cd /etc && python3 -m http.server 8081 & cd /etc && exec python3 -m http.server 8080"}}},
		Services: []*sandboxv1.Service{
			{Port: 8080, Visibility: public, Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS}},
			{Port: 8081, Visibility: public, Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN}},
		},
	}
	// Pinned to a runner without an edge: refused, saying why.
	sp.RunnerIds, sp.Mode = []string{"strict"}, sandboxv1.SandboxMode_SANDBOX_MODE_CKS
	_, err := c.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	noEdge := 0
	for _, v := range apierr.Violations(err) {
		if strings.HasSuffix(v.Field, ".endpoint") && strings.Contains(v.Description, "platform.endpoints") {
			noEdge++
		}
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument || noEdge != 2 {
		t.Fatalf("endpoints pinned to strict: %v", err)
	}
	// Unpinned: only open has an edge.
	sp.RunnerIds, sp.Mode = nil, 0
	res, err := c.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetSandboxId()
	if r := res.Msg.GetStatus().GetRunnerId(); r != "open" {
		t.Fatalf("sandbox with endpoints on %s, want open", r)
	}
	var urls []string
	deadline := time.Now().Add(2 * time.Minute)
	for len(urls) < 2 {
		st, err := c.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		urls = urls[:0]
		for _, s := range st.Msg.GetStatus().GetServices() {
			if u := s.GetEndpoint().GetUrl(); u != "" {
				urls = append(urls, u)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no URLs: %v", st.Msg.GetStatus())
		}
		time.Sleep(200 * time.Millisecond)
	}
	want := "https://8080-" + id + ".open." + "sandboxd.localhost:" + strconv.Itoa(testbed.EdgePort)
	if urls[0] != want {
		t.Fatalf("URL %q, want %q", urls[0], want)
	}

	// The edge's certificate chains to the platform CA and names this runner's wildcard.
	pemCA, err := os.ReadFile(b.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemCA)
	edgeAddr := net.JoinHostPort(strings.Split(b.RunnerAddr(1), ":")[0], strconv.Itoa(testbed.EdgePort))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, edgeAddr)
		}}}
	get := func(url, key string) (int, string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			req, _ := http.NewRequest("GET", url, nil)
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			res, err := hc.Do(req)
			if err == nil {
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusBadGateway {
					return res.StatusCode, string(body)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %v", url, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if code, body := get(urls[0]+"/hostname", ""); code != 200 || body != id+"\n" {
		t.Errorf("OPEN endpoint: %d %q", code, body)
	}
	if code, _ := get(urls[1]+"/hostname", ""); code != http.StatusUnauthorized {
		t.Errorf("TOKEN endpoint without a key: %d, want 401", code)
	}
	if code, _ := get(urls[1]+"/hostname", "sbx_0000000000000000_0000"); code != http.StatusUnauthorized {
		t.Errorf("TOKEN endpoint with a made-up key: %d, want 401", code)
	}
	if code, body := get(urls[1]+"/hostname", b.UserKey); code != 200 || body != id+"\n" {
		t.Errorf("TOKEN endpoint with the user's key (checked by the control plane): %d %q", code, body)
	}

	// The runner dies (kill -9) and comes back: the address is the same and serves again.
	b.Runners[1].Kill()
	if err := b.Runners[1].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	hc.CloseIdleConnections()
	if code, body := get(urls[0]+"/hostname", ""); code != 200 || body != id+"\n" {
		t.Errorf("OPEN endpoint after the runner restarted: %d %q", code, body)
	}
	// Deleted: the name leads nowhere, like one that never existed.
	if _, err := c.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	gone := strings.Replace(urls[0], id, "aaaaaaaaaaaaaaaa", 1)
	_, never := get(gone+"/", "")
	deadline = time.Now().Add(30 * time.Second)
	for {
		code, body := get(urls[0]+"/", "")
		if code == http.StatusNotFound && body == never {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after delete: %d %q, want the answer of a name that never existed (%q)", code, body, never)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
