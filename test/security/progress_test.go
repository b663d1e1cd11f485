package security

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// TestProgressOfAnotherOrgsSandbox (issue 24 §6): WatchSandboxProgress is scoped like
// every call: org-b's key on org-a's sandbox is NOT_FOUND CWSANDBOX_SANDBOX_NOT_FOUND
// over gRPC, gRPC-Web and Connect, and gets no update; org-a's own key gets its
// sandbox's progress, ending RUNNING.
func TestProgressOfAnotherOrgsSandbox(t *testing.T) {
	d := needDev(t)
	id := sandboxOf(t, d, d.KeyA)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, opt := range map[string]connect.ClientOption{"gRPC": connect.WithGRPC(), "gRPC-Web": connect.WithGRPCWeb(), "Connect": connect.WithProtoJSON()} {
		c := statev1connect.NewSandboxStateServiceClient(h2cClient(), d.API, opt, connect.WithInterceptors(connecttest.Bearer(d.KeyB)))
		st, err := c.WatchSandboxProgress(ctx, connect.NewRequest(&statev1.WatchSandboxProgressRequest{SandboxId: id}))
		if err == nil {
			if st.Receive() {
				t.Errorf("%s: org-b got org-a's progress: %v", name, st.Msg())
			}
			err = st.Err()
			_ = st.Close()
		}
		if connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.SandboxNotFound {
			t.Errorf("%s: org-b: %v, want NOT_FOUND %s", name, err, apierr.SandboxNotFound)
		}
	}
	c := statev1connect.NewSandboxStateServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.KeyA)))
	st, err := c.WatchSandboxProgress(ctx, connect.NewRequest(&statev1.WatchSandboxProgressRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	var last *statev1.WatchSandboxProgressResponse
	for st.Receive() {
		last = st.Msg()
	}
	if st.Err() != nil || last.GetState() != "STATE_RUNNING" || last.GetSandboxId() != id {
		t.Errorf("org-a: last %v, err %v; want its sandbox RUNNING", last, st.Err())
	}
}
