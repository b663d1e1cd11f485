package sbxcli

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// fakeState is SandboxStateService over the fake's sandboxes: every sandbox was created
// at fakeCreated with a lifetime of 600 s.
type fakeState struct {
	statev1connect.UnimplementedSandboxStateServiceHandler
	f *fakeAPI
}

var fakeCreated = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

func (s *fakeState) UpdateSandboxLifetime(_ context.Context, req *connect.Request[statev1.UpdateSandboxLifetimeRequest]) (*connect.Response[statev1.UpdateSandboxLifetimeResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.lifetimeReqs = append(s.f.lifetimeReqs, proto.Clone(req.Msg).(*statev1.UpdateSandboxLifetimeRequest))
	if _, ok := s.f.sandboxes[req.Msg.GetSandboxId()]; !ok {
		return nil, apierr.Newf(apierr.SandboxNotFound, "sandbox %q not found", req.Msg.GetSandboxId())
	}
	lt := int64(600) + req.Msg.GetExtendBySeconds()
	if v, ok := req.Msg.GetChange().(*statev1.UpdateSandboxLifetimeRequest_MaxLifetimeSeconds); ok {
		lt = v.MaxLifetimeSeconds
	}
	return connect.NewResponse(&statev1.UpdateSandboxLifetimeResponse{MaxLifetimeSeconds: lt,
		Deadline: timestamppb.New(fakeCreated.Add(time.Duration(lt) * time.Second))}), nil
}

func TestSbxLifetime(t *testing.T) {
	f := newFake(t)
	f.add("sbx-1")
	if out, errs, code := f.sbx("", "lifetime", "sbx-1", "--extend", "1h"); code != 0 || out != "sbx-1 lifetime 1h10m0s, until 2026-01-02T04:10:00Z\n" {
		t.Errorf("--extend 1h: %d %q %q", code, out, errs)
	}
	if out, errs, code := f.sbx("", "lifetime", "sbx-1", "--set", "2h"); code != 0 || out != "sbx-1 lifetime 2h0m0s, until 2026-01-02T05:00:00Z\n" {
		t.Errorf("--set 2h: %d %q %q", code, out, errs)
	}
	if _, _, code := f.sbx("", "lifetime", "sbx-1", "--extend", "-5m"); code != 0 {
		t.Errorf("--extend -5m: exit %d", code)
	}
	if len(f.lifetimeReqs) != 3 || f.lifetimeReqs[0].GetExtendBySeconds() != 3600 || f.lifetimeReqs[1].GetMaxLifetimeSeconds() != 7200 || f.lifetimeReqs[2].GetExtendBySeconds() != -300 {
		t.Errorf("requests: %v", f.lifetimeReqs)
	}
	for _, args := range [][]string{{"lifetime", "sbx-1"}, {"lifetime", "sbx-1", "--extend", "1h", "--set", "2h"}, {"lifetime", "sbx-1", "--set", "1.5s"}} {
		if _, errs, code := f.sbx("", args...); code == 0 || errs == "" {
			t.Errorf("%v: exit %d %q, want an error", args, code, errs)
		}
	}
	if len(f.lifetimeReqs) != 3 {
		t.Error("a bad lifetime command reached the API")
	}
	if _, errs, code := f.sbx("", "lifetime", "nope", "--extend", "1h"); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("unknown sandbox: %d %q", code, errs)
	}
}
