// Package jaegertest runs the Jaeger that scripts/build-jaeger.sh builds (`make jaeger`)
// into $SANDBOXD_CACHE/jaeger/<Version>/jaeger, for tests and benchmarks: an in-memory
// Jaeger v2 (the OpenTelemetry collector with Jaeger's storage and query) on free
// loopback ports, its OTLP receivers to export to and its query API to read traces back.
package jaegertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Version is the Jaeger Go module version; scripts/build-jaeger.sh builds the same.
const Version = "v1.75.0"

// RequireEnv set to 1 turns a skip for want of the binary into a failure.
const RequireEnv = "SANDBOXD_REQUIRE_JAEGER"

// Bin returns the path of the jaeger binary, or why there is none.
func Bin() (string, error) {
	cache := os.Getenv("SANDBOXD_CACHE")
	if cache == "" {
		cache = "/var/cache/sandboxd"
	}
	b := filepath.Join(cache, "jaeger", Version, "jaeger")
	if _, err := os.Stat(b); err != nil {
		return "", fmt.Errorf("jaeger is not built (make jaeger): %w", err)
	}
	return b, nil
}

// Need returns the binary's path, or skips t. With RequireEnv=1 an absent binary is
// built first (scripts/build-jaeger.sh, which waits for a build under way — CI starts
// one in the background — and then finds it cached), and a failed build fails t: so
// `make test` need not wait for Jaeger before any test runs, only this one does.
func Need(t testing.TB) string {
	t.Helper()
	b, err := Bin()
	if err != nil && os.Getenv(RequireEnv) == "1" {
		b, err = build()
		if err != nil {
			t.Fatalf("%v (%s=1 requires it)", err, RequireEnv)
		}
	}
	if err != nil {
		t.Skip(err)
	}
	return b
}

// buildMu makes the tests of one process wait for one build.
var buildMu sync.Mutex

// build runs scripts/build-jaeger.sh (found beside this source file) and returns Bin.
func build() (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, err := Bin(); err == nil {
		return b, nil
	}
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("jaegertest: cannot find the repository's scripts")
	}
	script := filepath.Join(filepath.Dir(self), "..", "..", "..", "scripts", "build-jaeger.sh")
	out, err := exec.Command("bash", script).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("jaegertest: %s: %w\n%s", script, err, tail(out, 2048))
	}
	return Bin()
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Jaeger is a running Jaeger.
type Jaeger struct {
	// OTLPGRPC and OTLPHTTP are the receivers' host:port.
	OTLPGRPC, OTLPHTTP string
	// Query is the query service's base URL (its UI and /api).
	Query string
}

const config = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 20000
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: %s
    grpc:
      endpoint: %s
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

func free(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Start runs Jaeger until t ends (skips t without the binary, see Need).
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin := Need(t)
	dir := t.TempDir()
	j := &Jaeger{OTLPGRPC: free(t), OTLPHTTP: free(t)}
	query, queryGRPC := free(t), free(t)
	j.Query = "http://" + query
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, query, queryGRPC, j.OTLPGRPC, j.OTLPHTTP), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "jaeger.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("jaeger log (tail):\n%s", b[max(0, len(b)-3000):])
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		ready := false
		if resp, err := http.Get(j.Query + "/api/services"); err == nil {
			resp.Body.Close()
			if c, err := net.DialTimeout("tcp", j.OTLPGRPC, time.Second); err == nil {
				c.Close()
				ready = resp.StatusCode == http.StatusOK
			}
		}
		if ready {
			return j
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("jaeger not ready after 60 s:\n%s", b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Span is a span as Jaeger's query API returns it.
type Span struct {
	TraceID, SpanID, Operation string
	// Parent is the span ID of its CHILD_OF reference ("" for a root); Links the span
	// IDs of FOLLOWS_FROM references and other traces' references.
	Parent  string
	Links   []string
	Service string
	Tags    map[string]any
	Start   time.Time
	Dur     time.Duration
}

// Trace is one trace's spans.
type Trace struct {
	ID    string
	Spans []Span
}

// Named returns the spans called op.
func (tr Trace) Named(op string) []Span {
	var out []Span
	for _, s := range tr.Spans {
		if s.Operation == op {
			out = append(out, s)
		}
	}
	return out
}

// ByID returns the span with span ID id.
func (tr Trace) ByID(id string) (Span, bool) {
	for _, s := range tr.Spans {
		if s.SpanID == id {
			return s, true
		}
	}
	return Span{}, false
}

type apiTraces struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			TraceID       string `json:"traceID"`
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			References    []struct {
				RefType string `json:"refType"`
				TraceID string `json:"traceID"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			StartTime int64 `json:"startTime"` // µs
			Duration  int64 `json:"duration"`  // µs
			Tags      []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
			ProcessID string `json:"processID"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
		} `json:"processes"`
	} `json:"data"`
}

// Traces returns up to limit recent traces of service that have a span called operation
// ("" any).
func (j *Jaeger) Traces(ctx context.Context, service, operation string, limit int) ([]Trace, error) {
	q := url.Values{"service": {service}, "limit": {fmt.Sprint(limit)}, "lookback": {"1h"}}
	if operation != "" {
		q.Set("operation", operation)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+"/api/traces?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jaeger query: %s", resp.Status)
	}
	var body apiTraces
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	var out []Trace
	for _, d := range body.Data {
		tr := Trace{ID: d.TraceID}
		for _, s := range d.Spans {
			sp := Span{TraceID: s.TraceID, SpanID: s.SpanID, Operation: s.OperationName, Tags: map[string]any{},
				Service: d.Processes[s.ProcessID].ServiceName,
				Start:   time.UnixMicro(s.StartTime), Dur: time.Duration(s.Duration) * time.Microsecond}
			for _, r := range s.References {
				if r.RefType == "CHILD_OF" && r.TraceID == s.TraceID && sp.Parent == "" {
					sp.Parent = r.SpanID
				} else {
					sp.Links = append(sp.Links, r.TraceID+"/"+r.SpanID)
				}
			}
			for _, tg := range s.Tags {
				sp.Tags[tg.Key] = tg.Value
			}
			tr.Spans = append(tr.Spans, sp)
		}
		out = append(out, tr)
	}
	return out, nil
}

// Await polls for a trace of service with a span called operation for which ok holds,
// until timeout; it fails t with the last traces seen otherwise.
func (j *Jaeger) Await(t testing.TB, service, operation string, ok func(Trace) bool, timeout time.Duration) Trace {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last []Trace
	var lastErr error
	for {
		trs, err := j.Traces(ctx, service, operation, 50)
		if err == nil {
			last = trs
			for _, tr := range trs {
				if ok(tr) {
					return tr
				}
			}
		} else if !errors.Is(err, context.DeadlineExceeded) {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			var b strings.Builder
			for _, tr := range last {
				fmt.Fprintf(&b, "trace %s:\n", tr.ID)
				for _, s := range tr.Spans {
					fmt.Fprintf(&b, "  %s %s parent=%s (%s)\n", s.SpanID, s.Operation, s.Parent, s.Service)
				}
			}
			t.Fatalf("no trace of %s with %s as wanted after %s (last error %v); seen:\n%s", service, operation, timeout, lastErr, b.String())
			return Trace{}
		case <-time.After(500 * time.Millisecond):
		}
	}
}
