package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/dataplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// BenchmarkDirectFiles: 32 MiB written then read back by the Go SDK, through the
// gateway (h2c, as `sandboxd dev`) and on the runner's direct mTLS data plane, the
// modes alternating in one run on one sandbox; reports the median MB/s of each.
func BenchmarkDirectFiles(b *testing.B) {
	const size = 32 << 20
	s := newStack(b, 0)
	keys, err := auth.OpenKeyring(filepath.Join(b.TempDir(), "keys.json"))
	if err != nil {
		b.Fatal(err)
	}
	key, _, err := keys.Create("bench", auth.RoleUser, "")
	if err != nil {
		b.Fatal(err)
	}
	dpCA, err := dataplane.LoadOrCreateCA(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	local := runner.NewLocal("local", s.Runner)
	dp, uri, err := dataplane.Start(dataplane.ListenConfig{Listen: "127.0.0.1:0", CA: dpCA, Sandboxes: local})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(dp.Close)
	local.DataPlaneURI = uri
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{local}, DataPlane: &dataplane.Issuer{CA: dpCA}})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	b.Cleanup(srv.Close)

	ctx := context.Background()
	modes := []sandbox.DataPlaneMode{sandbox.DataPlaneGateway, sandbox.DataPlaneDirect}
	handles := map[sandbox.DataPlaneMode]*sandbox.Sandbox{}
	var id string
	for _, m := range modes {
		c, err := sandbox.New(srv.URL, key, sandbox.WithDataPlane(m))
		if err != nil {
			b.Fatal(err)
		}
		if id == "" {
			sb, err := c.Create(ctx, sandbox.Spec{Image: env.Busybox(), Command: "sleep", Args: []string{"3600"}})
			if err != nil {
				b.Fatal(err)
			}
			id = sb.ID()
		}
		handles[m] = c.Sandbox(id)
	}
	data := make([]byte, size)
	_, _ = rand.Read(data)
	write, read := map[sandbox.DataPlaneMode][]float64{}, map[sandbox.DataPlaneMode][]float64{}
	mbps := func(d time.Duration) float64 { return size / d.Seconds() / 1e6 }
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, m := range modes {
			h := handles[m]
			t0 := time.Now()
			if err := h.WriteFile(ctx, "/tmp/big", data); err != nil {
				b.Fatalf("%s write: %v", m, err)
			}
			write[m] = append(write[m], mbps(time.Since(t0)))
			t0 = time.Now()
			back, err := h.ReadFile(ctx, "/tmp/big")
			if err != nil {
				b.Fatalf("%s read: %v", m, err)
			}
			read[m] = append(read[m], mbps(time.Since(t0)))
			if !bytes.Equal(back, data) {
				b.Fatalf("%s: read back differs", m)
			}
		}
	}
	b.StopTimer()
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	for _, m := range modes {
		b.ReportMetric(median(write[m]), string(m)+"-write-MB/s")
		b.ReportMetric(median(read[m]), string(m)+"-read-MB/s")
	}
}
