// Package promtest finds the Prometheus binaries scripts/build-prometheus.sh builds
// (`make prometheus`) into $SANDBOXD_CACHE/prometheus/<Version>/ and runs them for tests:
// `promtool check metrics` on a scrape, and a Prometheus server that scrapes a target.
package promtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Version is the Prometheus Go module version; scripts/build-prometheus.sh builds the same.
const Version = "v0.316.0"

// RequireEnv set to 1 turns a skip for want of the binaries into a failure.
const RequireEnv = "SANDBOXD_REQUIRE_PROMETHEUS"

// Bin returns the path of name ("promtool" or "prometheus"), or why there is none.
func Bin(name string) (string, error) {
	cache := os.Getenv("SANDBOXD_CACHE")
	if cache == "" {
		cache = "/var/cache/sandboxd"
	}
	b := filepath.Join(cache, "prometheus", Version, name)
	if _, err := os.Stat(b); err != nil {
		return "", fmt.Errorf("%s is not built (make prometheus): %w", name, err)
	}
	return b, nil
}

// Have reports whether the binaries are built, or required (RequireEnv=1: Need fails
// then). A test can check what it can without them when not.
func Have() bool {
	_, e1 := Bin("promtool")
	_, e2 := Bin("prometheus")
	return e1 == nil && e2 == nil || os.Getenv(RequireEnv) == "1"
}

// Need returns name's path, or skips t (fails it with RequireEnv=1).
func Need(t testing.TB, name string) string {
	t.Helper()
	b, err := Bin(name)
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%v (%s=1 requires it)", err, RequireEnv)
		}
		t.Skip(err)
	}
	return b
}

// CheckMetrics runs `promtool check metrics` on a scrape and returns its complaints
// ("" when clean).
func CheckMetrics(t testing.TB, scrape []byte) string {
	t.Helper()
	bin := Need(t, "promtool")
	cmd := exec.Command(bin, "check", "metrics")
	cmd.Stdin = bytes.NewReader(scrape)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if len(out) == 0 {
			t.Fatalf("promtool check metrics: %v", err)
		}
		return string(out)
	}
	return ""
}

// Server is a running Prometheus server.
type Server struct {
	URL string // http://127.0.0.1:port
}

// Start runs a Prometheus server that scrapes target (host:port, path /metrics) every
// interval, until the test ends.
func Start(t testing.TB, target string, interval time.Duration) *Server {
	t.Helper()
	bin := Need(t, "prometheus")
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: %s\n  scrape_timeout: %s\nscrape_configs:\n  - job_name: sandboxd\n    static_configs:\n      - targets: [%q]\n",
		interval, interval, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log (tail):\n%s", tail(log.String(), 3000))
		}
	})
	s := &Server{URL: "http://" + addr}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(s.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus at %s not ready: %v", addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Sample is one instant-vector sample of a query.
type Sample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

// Query runs an instant query through the HTTP API.
func (s *Server) Query(ctx context.Context, q string) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/v1/query?query="+url.QueryEscape(q), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string   `json:"resultType"`
			Result     []Sample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %q: %s: %s", q, body.Status, body.Error)
	}
	if body.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: result type %s", q, body.Data.ResultType)
	}
	return body.Data.Result, nil
}

// Await polls q until it returns a sample all of whose want labels match, or fails t.
func (s *Server) Await(t testing.TB, q string, want map[string]string, timeout time.Duration) Sample {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last []Sample
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		last, lastErr = s.Query(ctx, q)
		cancel()
		for _, smp := range last {
			ok := true
			for k, v := range want {
				if smp.Metric[k] != v {
					ok = false
				}
			}
			if ok {
				return smp
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("prometheus: no sample of %q with %v within %s (last: %v, err %v)", q, want, timeout, last, lastErr)
	return Sample{}
}

// Targets returns the health of the server's scrape targets ("up", "down", "unknown").
func (s *Server) Targets(ctx context.Context) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/v1/targets", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			ActiveTargets []struct {
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	var out []string
	for _, tg := range body.Data.ActiveTargets {
		out = append(out, strings.TrimSpace(tg.Health+" "+tg.LastError))
	}
	return out, nil
}
