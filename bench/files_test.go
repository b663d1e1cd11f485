package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

const (
	filesBig   = 32 << 20   // the largest unary file of both clients
	filesSmall = 20_000_000 // the concurrency line's writes
	filesConc  = 10
)

// BenchmarkFiles: file throughput through the gateway (h2c, as `sandboxd dev`), against
// the floor measured in the same run: a bare Go HTTP/2 cleartext server on loopback that
// stores an uploaded body in a file on tmpfs (the kind of disk a sandbox's /tmp is) and
// sends it back. b.N times each: 32 MiB written then read back with the floor's client,
// with the Go SDK and with the official Python client (skipped without python3 and
// cwsandbox: make pydeps), medians in MB/s and as a fraction of the floor (targets: the
// Go SDK ≥ 1 GB/s, the official client ≥ 250 MB/s each way). Then the concurrency line:
// ten 20 MB writes at once, each to its own sandbox, against one alone (target: the ten
// finish within 2× of one alone × 10 / cores).
func BenchmarkFiles(b *testing.B) {
	s := newStack(b, 0)
	url, key := servedGateway(b, s)
	ctx := context.Background()
	data := make([]byte, filesBig)
	_, _ = rand.Read(data)
	mbps := func(n int, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	n := max(b.N, 1)

	floorURL, hc := fileFloor(b)
	var fw, fr []float64
	for range n {
		t0 := time.Now()
		floorPut(b, hc, floorURL, data)
		fw = append(fw, mbps(filesBig, time.Since(t0)))
		t0 = time.Now()
		back := floorGet(b, hc, floorURL)
		fr = append(fr, mbps(filesBig, time.Since(t0)))
		if !bytes.Equal(back, data) {
			b.Fatal("floor: read back differs")
		}
	}
	floorW, floorR := median(fw), median(fr)
	b.ReportMetric(floorW, "floor-write-MB/s")
	b.ReportMetric(floorR, "floor-read-MB/s")
	fmt.Printf("files, floor (bare Go HTTP/2 h2c server on loopback, tmpfs), 32 MiB, %d runs: write %.0f MB/s, read %.0f MB/s\n", n, floorW, floorR)

	c, err := sandbox.New(url, key, sandbox.WithDataPlane(sandbox.DataPlaneGateway))
	if err != nil {
		b.Fatal(err)
	}
	spec := sandbox.Spec{Image: env.Busybox(), Command: "sleep", Args: []string{"3600"}}
	sbs := make([]*sandbox.Sandbox, filesConc)
	for i := range sbs {
		if sbs[i], err = c.Create(ctx, spec); err != nil {
			b.Fatal(err)
		}
	}
	sb := sbs[0]
	if err := sb.WriteFile(ctx, "/tmp/warm", []byte("x")); err != nil { // waits for RUNNING
		b.Fatal(err)
	}
	var gw, gr []float64
	b.ResetTimer()
	for range n {
		t0 := time.Now()
		if err := sb.WriteFile(ctx, "/tmp/big", data); err != nil {
			b.Fatal(err)
		}
		gw = append(gw, mbps(filesBig, time.Since(t0)))
		t0 = time.Now()
		back, err := sb.ReadFile(ctx, "/tmp/big")
		if err != nil {
			b.Fatal(err)
		}
		gr = append(gr, mbps(filesBig, time.Since(t0)))
		if !bytes.Equal(back, data) {
			b.Fatal("Go SDK: read back differs")
		}
	}
	b.StopTimer()
	sdkW, sdkR := median(gw), median(gr)
	b.ReportMetric(sdkW, "sdk-write-MB/s")
	b.ReportMetric(sdkR, "sdk-read-MB/s")
	fmt.Printf("files, Go SDK through the gateway, 32 MiB, %d runs: write %.0f MB/s (%.2fx the floor), read %.0f MB/s (%.2fx the floor) (target ≥ 1000 MB/s each)\n",
		n, sdkW, sdkW/floorW, sdkR, sdkR/floorR)

	filesConcurrency(b, sbs, data[:filesSmall])
	cleanup(b, s)
	filesOfficialClient(b, url, key, n, floorW, floorR)
}

// filesConcurrency times one 20 MB write alone (the median of three) and ten at once,
// one to each sandbox of sbs.
func filesConcurrency(b *testing.B, sbs []*sandbox.Sandbox, data []byte) {
	b.Helper()
	ctx := context.Background()
	var alone []time.Duration
	for range 3 {
		t0 := time.Now()
		if err := sbs[0].WriteFile(ctx, "/tmp/c", data); err != nil {
			b.Fatal(err)
		}
		alone = append(alone, time.Since(t0))
	}
	for _, h := range sbs[1:] { // every sandbox running and its agent connected
		if err := h.WriteFile(ctx, "/tmp/warm", []byte("x")); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(alone)
	one := alone[1]
	var wg sync.WaitGroup
	errs := make([]error, len(sbs))
	t0 := time.Now()
	for i, h := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = h.WriteFile(ctx, "/tmp/c", data)
		}()
	}
	wg.Wait()
	all := time.Since(t0)
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	cores := runtime.NumCPU()
	budget := time.Duration(float64(one) * float64(len(sbs)) / float64(cores))
	b.ReportMetric(float64(all)/float64(budget), "concurrent/(alone×10/cores)")
	fmt.Printf("files, Go SDK through the gateway, %d × 20 MB writes at once, one per sandbox: %.0f ms; one alone %.0f ms; %.2fx of one alone × %d / %d cores (target ≤ 2x)\n",
		len(sbs), ms(all), ms(one), float64(all)/float64(budget), len(sbs), cores)
}

// filesOfficialClient runs files/files.py (n writes and reads of 32 MiB) through the
// official client.
func filesOfficialClient(b *testing.B, url, key string, n int, floorW, floorR float64) {
	b.Helper()
	if err := exec.Command("python3", "-c", "import cwsandbox").Run(); err != nil {
		b.Logf("official client part skipped: python3 with cwsandbox not found (make pydeps): %v", err)
		return
	}
	cmd := exec.Command("python3", "files/files.py", strconv.Itoa(n), env.Busybox())
	cmd.Env = append(os.Environ(), "CWSANDBOX_BASE_URL="+url, "CWSANDBOX_API_KEY="+key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("files.py: %v\n%s", err, stderr.String())
	}
	got := map[string][]float64{}
	for line := range strings.Lines(string(out)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.Fatalf("files.py: %q: %v", line, err)
		}
		got[k] = append(got[k], f)
	}
	if len(got["write"]) != n || len(got["read"]) != n {
		b.Fatalf("files.py gave %d writes and %d reads, want %d:\n%s", len(got["write"]), len(got["read"]), n, out)
	}
	slices.Sort(got["write"])
	slices.Sort(got["read"])
	w, r := got["write"][n/2], got["read"][n/2]
	b.ReportMetric(w, "official-client-write-MB/s")
	b.ReportMetric(r, "official-client-read-MB/s")
	fmt.Printf("files, official Python client through the gateway, 32 MiB, %d runs: write %.0f MB/s (%.2fx the floor), read %.0f MB/s (%.2fx the floor) (target ≥ 250 MB/s each)\n",
		n, w, w/floorW, r, r/floorR)
}

// fileFloor serves PUT /f (the body stored in a file on tmpfs) and GET /f (the file) over
// HTTP/2 cleartext on loopback, with net/http's defaults, as the gateway is served.
func fileFloor(b *testing.B) (string, *http.Client) {
	b.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "bench-files-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "f")
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /f", func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Create(path)
		if err == nil {
			_, err = io.Copy(f, r.Body)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("GET /f", func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		_, _ = io.Copy(w, f)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return "http://" + ln.Addr().String() + "/f", &http.Client{Transport: tr}
}

func floorPut(b *testing.B, hc *http.Client, url string, data []byte) {
	b.Helper()
	req, err := http.NewRequest(http.MethodPut, url, bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	res, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b.Fatalf("floor PUT: %s", res.Status)
	}
}

func floorGet(b *testing.B, hc *http.Client, url string) []byte {
	b.Helper()
	res, err := hc.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b.Fatalf("floor GET: %s", res.Status)
	}
	buf := bytes.NewBuffer(make([]byte, 0, filesBig+512))
	if _, err := buf.ReadFrom(res.Body); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
