package security

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// TestAPIInvalidUTF8InPathAndQuery: a REST path or query parameter name holding a
// percent-encoded byte that is not UTF-8 is quoted back in the error. The quote made the
// error fail to encode: an unknown route was {"code":13,"message":"cannot encode the
// error"} (no reason), an unknown query parameter lost its field violation, an unknown
// procedure (Connect) its ErrorInfo; a path variable or query value that is not UTF-8
// was 500 UNKNOWN ("string field contains invalid UTF-8"). Now each is its proper error,
// with its details.
func TestAPIInvalidUTF8InPathAndQuery(t *testing.T) {
	d := needDev(t)
	authz := "Bearer " + d.KeyA
	for _, tc := range []struct {
		what, method, path string
		status, code       int
		reason, field      string
	}{
		{"unknown route", "GET", "/v1/no%FFroute%E2%82", http.StatusNotFound, int(connect.CodeNotFound), apierr.RouteNotFound, ""},
		{"method not allowed", "PUT", "/v1/sandboxes/sbx-%FF", http.StatusMethodNotAllowed, int(connect.CodeUnimplemented), apierr.NotImplemented, ""},
		{"unknown query parameter", "GET", "/v1/sandboxes?%FFx%C3=1", http.StatusBadRequest, int(connect.CodeInvalidArgument), apierr.InvalidRequest, "\uFFFDx\uFFFD"},
		{"path variable", "GET", "/v1/sandboxes/sbx-%FF%FE", http.StatusBadRequest, int(connect.CodeInvalidArgument), apierr.InvalidRequest, "sandbox_id"},
		{"query value", "GET", "/v1/sandboxes?tags=ok&tags=%C3%28", http.StatusBadRequest, int(connect.CodeInvalidArgument), apierr.InvalidRequest, "tags"},
	} {
		st, b := rest(t, d, tc.method, tc.path, authz, nil)
		t.Logf("%s: HTTP %d %s", tc.what, st, b)
		if !utf8.Valid(b) {
			t.Errorf("%s: the body is not UTF-8: %q", tc.what, b)
		}
		var e apiError
		if err := json.Unmarshal(b, &e); err != nil {
			t.Errorf("%s: %v: %s", tc.what, err, b)
			continue
		}
		if st != tc.status || e.Code != tc.code || e.reason() != tc.reason {
			t.Errorf("%s: HTTP %d code %d reason %q, want HTTP %d code %d %s: %s", tc.what, st, e.Code, e.reason(), tc.status, tc.code, tc.reason, b)
		}
		if tc.field != "" && !strings.Contains(strings.Join(e.fields(), " "), tc.field) {
			t.Errorf("%s: field violations %q, want %q", tc.what, e.fields(), tc.field)
		}
	}
	for name, opt := range map[string]connect.ClientOption{"gRPC": connect.WithGRPC(), "Connect": connect.WithProtoJSON()} {
		c := connect.NewClient[emptypb.Empty, emptypb.Empty](h2cClient(), d.API+"/coreweave.sandbox.v1.SandboxService/No%FFSuch", opt)
		req := connect.NewRequest(&emptypb.Empty{})
		req.Header().Set("Authorization", authz)
		_, err := c.CallUnary(t.Context(), req)
		t.Logf("%s unknown procedure: %v %v", name, err, apierr.Info(err))
		if connect.CodeOf(err) != connect.CodeUnimplemented || apierr.Reason(err) != apierr.NotImplemented {
			t.Errorf("%s unknown procedure: %v (reason %q), want UNIMPLEMENTED %s", name, err, apierr.Reason(err), apierr.NotImplemented)
		}
	}
}
