package edge

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestWakeBeforeEachRequest: every admitted request asks Config.Wake first and ends its
// busy time when it is served (HTTP/2 and the HTTP/1.1 fast path alike); a sandbox that
// cannot be woken gets 503 and nothing reaches it; a request that fails admission wakes
// nothing.
func TestWakeBeforeEachRequest(t *testing.T) {
	var (
		mu       sync.Mutex
		woken    []string
		open     int
		refuse   bool
		backends int
	)
	te := startEdge(t, func(c *Config) {
		c.Wake = func(_ context.Context, id string) (func(), error) {
			mu.Lock()
			defer mu.Unlock()
			woken = append(woken, id)
			if refuse {
				return nil, errors.New("paused")
			}
			open++
			return func() {
				mu.Lock()
				open--
				mu.Unlock()
			}, nil
		}
	})
	url := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		backends++
		busy := open
		mu.Unlock()
		if busy != 1 {
			t.Errorf("the sandbox served a request while %d requests were busy, want 1", busy)
		}
	}))
	tokenURL := te.httpRoute(t, sbxB, 8080, AuthToken, 0, http.NotFoundHandler())
	for _, proto := range []string{"h2", "http/1.1"} {
		res, _ := get(t, te.client(proto), url) //nolint:bodyclose // get reads and closes the body
		if res.StatusCode != http.StatusOK {
			t.Errorf("%s: %s", proto, res.Status)
		}
	}
	// done is called as each request's handler returns, which may be just after its
	// client had the answer.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		busy := open
		mu.Unlock()
		if busy == 0 || time.Now().After(deadline) {
			break
		}
	}
	mu.Lock()
	if len(woken) != 2 || open != 0 {
		t.Errorf("woken %v, busy %d after the requests", woken, open)
	}
	refuse = true
	mu.Unlock()
	for _, proto := range []string{"h2", "http/1.1"} {
		if res, _ := get(t, te.client(proto), url); res.StatusCode != http.StatusServiceUnavailable { //nolint:bodyclose // get reads and closes the body
			t.Errorf("%s to a sandbox that cannot be woken: %s, want 503", proto, res.Status)
		}
	}
	if res, _ := get(t, te.client("h2"), tokenURL); res.StatusCode != http.StatusUnauthorized { //nolint:bodyclose // get reads and closes the body
		t.Errorf("unauthorized: %s", res.Status)
	}
	mu.Lock()
	defer mu.Unlock()
	if backends != 2 || len(woken) != 4 {
		t.Errorf("backend requests %d, wakes %v; want 2 and 4 (none for the refused token)", backends, woken)
	}
}

// TestWakeBeforePassthrough: a passthrough connection wakes its sandbox first and stays
// busy until it closes; one that cannot be woken is closed with nothing sent on.
func TestWakeBeforePassthrough(t *testing.T) {
	var (
		mu          sync.Mutex
		refuse      bool
		open, wakes int
		closedWakes = make(chan struct{}, 4)
	)
	te := startEdge(t, func(c *Config) {
		c.Wake = func(context.Context, string) (func(), error) {
			mu.Lock()
			defer mu.Unlock()
			wakes++
			if refuse {
				return nil, errors.New("paused")
			}
			open++
			return func() {
				mu.Lock()
				open--
				mu.Unlock()
				closedWakes <- struct{}{}
			}, nil
		}
	})
	host := Host(5432, sbxB, testRunner, testDomain)
	w := startWorkload(t, host)
	te.rm.add(Route{SandboxID: sbxB, Port: 5432, Kind: KindPassthrough, Backend: addrPort(t, w.addr)})
	c, err := te.dialTLS(host, w.ca.Pool())
	if err != nil {
		t.Fatalf("handshake through the edge: %v", err)
	}
	mu.Lock()
	if wakes != 1 || open != 1 {
		t.Errorf("during the connection: %d wakes, %d busy", wakes, open)
	}
	refuse = true
	mu.Unlock()
	c.Close()
	select {
	case <-closedWakes:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection's end did not end its busy time")
	}
	if _, err := te.dialTLS(host, w.ca.Pool()); err == nil {
		t.Error("handshake with a sandbox that cannot be woken")
	}
}
