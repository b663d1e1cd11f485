package sbxcli

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	quotav1 "github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1/quotav1connect"
)

// fakeQuotas keeps one organization's quota as set.
type fakeQuotas struct {
	mu   sync.Mutex
	set  *quotav1.QuotaLimits
	sets []*quotav1.SetQuotaRequest
}

func (f *fakeQuotas) quota(org string) *quotav1.Quota {
	eff := &quotav1.QuotaLimits{MaxSandboxes: f.set.MaxSandboxes, MaxCpuMillicores: f.set.MaxCpuMillicores, MaxMemoryBytes: f.set.MaxMemoryBytes}
	return &quotav1.Quota{OrgId: org, Limits: f.set, Effective: eff}
}

func (f *fakeQuotas) GetQuota(_ context.Context, req *connect.Request[quotav1.GetQuotaRequest]) (*connect.Response[quotav1.Quota], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return connect.NewResponse(f.quota(req.Msg.GetOrgId())), nil
}

func (f *fakeQuotas) SetQuota(_ context.Context, req *connect.Request[quotav1.SetQuotaRequest]) (*connect.Response[quotav1.Quota], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, req.Msg)
	f.set = req.Msg.GetLimits()
	return connect.NewResponse(f.quota(req.Msg.GetOrgId())), nil
}

func (f *fakeQuotas) GetQuotaUsage(_ context.Context, req *connect.Request[quotav1.GetQuotaUsageRequest]) (*connect.Response[quotav1.QuotaUsage], error) {
	four := int64(4)
	vb, ns := int64(100<<30), int64(50)
	return connect.NewResponse(&quotav1.QuotaUsage{OrgId: "acme", Sandboxes: 3, CpuMillicores: 1500, MemoryBytes: 1 << 30, ReservedSandboxes: 1,
		Volumes: 2, VolumeBytes: 20 << 30, Snapshots: 7, SnapshotBytes: 1 << 30, MaxSnapshots: 50, MaxSnapshotBytes: -1,
		Effective: &quotav1.QuotaLimits{MaxSandboxes: &four, MaxVolumeBytes: &vb, MaxSnapshots: &ns}}), nil
}

func TestQuotaCommands(t *testing.T) {
	ten, cpu := int64(10), int64(2000)
	f := &fakeQuotas{set: &quotav1.QuotaLimits{MaxSandboxes: &ten, MaxCpuMillicores: &cpu}}
	mux := http.NewServeMux()
	mux.Handle(quotav1connect.NewQuotaServiceHandler(f))
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	sbx := func(args ...string) (string, string, int) {
		return runSbx(context.Background(), "", append([]string{"--base-url", "http://" + ln.Addr().String(), "--api-key", "k"}, args...)...)
	}

	// A flag not given keeps its limit; "unlimited" is -1; "default" unsets.
	out, errOut, code := sbx("admin", "quota", "set", "--org", "acme", "--max-memory", "64Gi", "--max-cpu", "default")
	if code != 0 {
		t.Fatalf("set: %d %s", code, errOut)
	}
	l := f.sets[0].GetLimits()
	if f.sets[0].GetOrgId() != "acme" || l.GetMaxSandboxes() != 10 || l.MaxCpuMillicores != nil || l.GetMaxMemoryBytes() != 64<<30 {
		t.Fatalf("set sent %v", f.sets[0])
	}
	if !strings.Contains(out, "64Gi") || !strings.Contains(out, "default") {
		t.Errorf("set printed %q", out)
	}
	if _, _, code := sbx("admin", "quota", "set", "--org", "acme", "--max-sandboxes", "unlimited"); code != 0 || f.sets[1].GetLimits().GetMaxSandboxes() != -1 {
		t.Fatalf("unlimited: %d %v", code, f.sets[1])
	}
	if _, errOut, code := sbx("admin", "quota", "set", "--org", "acme", "--max-cpu", "lots"); code == 0 || !strings.Contains(errOut, "--max-cpu") {
		t.Fatalf("bad value: %d %s", code, errOut)
	}
	if _, errOut, code := sbx("admin", "quota", "set", "--max-cpu", "1"); code == 0 || !strings.Contains(errOut, "--org") {
		t.Fatalf("no --org: %d %s", code, errOut)
	}
	// Storage limits: volume bytes and per-organization snapshot limits.
	if _, errOut, code := sbx("admin", "quota", "set", "--org", "acme", "--max-volume-bytes", "500Gi", "--max-snapshots", "20", "--max-snapshot-bytes", "unlimited"); code != 0 {
		t.Fatalf("storage: %d %s", code, errOut)
	}
	if l := f.sets[2].GetLimits(); l.GetMaxVolumeBytes() != 500<<30 || l.GetMaxSnapshots() != 20 || l.GetMaxSnapshotBytes() != -1 || l.GetMaxSandboxes() != -1 {
		t.Fatalf("storage sent %v", l)
	}
	out, _, code = sbx("quota")
	flat := strings.Join(strings.Fields(out), " ")
	if code != 0 || !strings.Contains(out, "acme") || !strings.Contains(flat, "sandboxes 3 4 1") || !strings.Contains(out, "unlimited") ||
		!strings.Contains(flat, "volume bytes 20Gi (2 volumes) 100Gi") || !strings.Contains(flat, "snapshots 7 50") || !strings.Contains(flat, "snapshot bytes 1Gi unlimited") {
		t.Fatalf("quota: %d %q", code, out)
	}
}
