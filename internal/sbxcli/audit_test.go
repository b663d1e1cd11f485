package sbxcli

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1/auditv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// fakeAudit serves 5 events in pages of 2 and records the requests.
type fakeAudit struct {
	mu   sync.Mutex
	reqs []*auditv1.ListAuditEventsRequest
}

func (f *fakeAudit) ListAuditEvents(_ context.Context, req *connect.Request[auditv1.ListAuditEventsRequest]) (*connect.Response[auditv1.ListAuditEventsResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req.Msg)
	if req.Msg.GetResult() == "NOPE" {
		return nil, apierr.Invalid(apierr.InvalidRequest, "bad result", []apierr.Violation{{Field: "result", Description: "not a code"}})
	}
	start := 0
	if req.Msg.GetPageToken() != "" {
		start = int(req.Msg.GetPageToken()[0] - '0')
	}
	out := &auditv1.ListAuditEventsResponse{}
	for i := start; i < 5 && len(out.Events) < min(2, int(req.Msg.GetPageSize())); i++ {
		out.Events = append(out.Events, &auditv1.AuditEvent{EventId: string(rune('a' + i)), Time: timestamppb.New(time.Date(2026, 12, 4, 10, i, 0, 0, time.UTC)),
			OrgId: "acme", KeyId: "k1", SourceAddress: "10.0.0.9", Method: "/coreweave.sandbox.v1.SandboxService/CreateSandbox",
			TargetType: "sandbox", TargetId: "sb-" + string(rune('0'+i)), Result: "OK", RequestId: "r"})
		if i == 4 { // a platform admin's call on acme's objects
			e := out.Events[len(out.Events)-1]
			e.KeyId, e.ActorOrgId = "kp", "platform\x1b[2J"
		}
		if i+1 < 5 {
			out.NextPageToken = string(rune('0' + i + 1))
		} else {
			out.NextPageToken = ""
		}
	}
	return connect.NewResponse(out), nil
}

func TestAdminAuditCommand(t *testing.T) {
	f := &fakeAudit{}
	mux := http.NewServeMux()
	mux.Handle(auditv1connect.NewAuditServiceHandler(f))
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

	// A table of every event (--limit 0 follows the pages), with the filters sent.
	out, errOut, code := sbx("admin", "audit", "--limit", "0", "--since", "2026-12-01T00:00:00Z", "--until", "1h", "--method", "CreateSandbox", "--key", "k1", "--result", "ok")
	if code != 0 {
		t.Fatalf("audit: %d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "TIME") || !strings.Contains(lines[1], "CreateSandbox") || !strings.Contains(lines[1], "sandbox/sb-0") {
		t.Fatalf("table:\n%s", out)
	}
	if f := strings.Fields(lines[5]); len(f) < 3 || f[1] != "acme" || f[2] != `kp@"platform\x1b[2J"` {
		t.Fatalf("a platform admin's event: %v", f)
	}
	r := f.reqs[0]
	if r.GetMethod() != "CreateSandbox" || r.GetKeyId() != "k1" || r.GetResult() != "OK" || !r.GetStartTime().AsTime().Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) ||
		time.Until(r.GetEndTime().AsTime()) > -59*time.Minute || len(f.reqs) != 3 {
		t.Fatalf("sent %v in %d pages", r, len(f.reqs))
	}

	// JSON lines, bounded by --limit.
	out, errOut, code = sbx("admin", "audit", "--json", "--limit", "3")
	if code != 0 {
		t.Fatalf("audit --json: %d %s", code, errOut)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("JSON lines:\n%s", out)
	}
	for _, l := range lines {
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil || e["org_id"] != "acme" || e["result"] != "OK" {
			t.Fatalf("line %q: %v", l, err)
		}
	}

	// Errors: a bad time, the server's refusal.
	if _, errOut, code := sbx("admin", "audit", "--since", "yesterday"); code == 0 || !strings.Contains(errOut, "--since") {
		t.Errorf("bad --since: %d %s", code, errOut)
	}
	if _, errOut, code := sbx("admin", "audit", "--result", "nope"); code == 0 || !strings.Contains(errOut, "CWSANDBOX_INVALID_REQUEST") {
		t.Errorf("refused filter: %d %s", code, errOut)
	}
}

// TestAuditCell: a value with a control sequence, tab or newline is shown quoted and
// escaped, so it cannot forge cells or rows of `sbx admin audit` or drive the terminal.
func TestAuditCell(t *testing.T) {
	for in, want := range map[string]string{
		"sb-1":            "sb-1",
		"é 日本":            "é 日本",
		"a\tb":            `"a\tb"`,
		"x\x1b]52;c;Zm9v": `"x\x1b]52;c;Zm9v"`,
		"r\nforged":       `"r\nforged"`,
		"bidi\u202e":      `"bidi\u202e"`,
	} {
		if got := cell(in); got != want {
			t.Errorf("cell(%q) = %s, want %s", in, got, want)
		}
	}
}
