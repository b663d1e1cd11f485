package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// GetSandboxBuildLogs answers a short-lived URL of the build log of a sandbox's Compose
// service (one CreateSandboxFromFile built): GET on this API port, no API key, the
// build's log as text. The URL carries its authority: an expiry and an HMAC-SHA256 over
// the organization, the build and the expiry under the gateway's share-token key
// (Config.ShareTokenKey; another label), so gateway replicas with the same key accept
// each other's URLs. It reads only that build's stored log, for BuildLogURLTTL.

// BuildLogPath serves the URLs of GetSandboxBuildLogs (public on the API port: the URL
// authenticates itself).
const BuildLogPath = "/v1/sandboxBuildLogs"

// BuildLogURLTTL is how long a URL of GetSandboxBuildLogs works.
const BuildLogURLTTL = 15 * time.Minute

// buildLogLabel separates these MACs from the key's other uses (shareTokenLabel).
const buildLogLabel = "sandboxd build log URL v1\x00"

// maxBuildLogText bounds the text one URL serves (a build keeps at most
// DefaultMaxBuildLogBytes of lines, plus its steps).
const maxBuildLogText = 16 << 20

func (k shareTokens) buildLogMAC(org, buildID string, expires int64) []byte {
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte(buildLogLabel + org + "\x00" + buildID + "\x00" + strconv.FormatInt(expires, 10)))
	return m.Sum(nil)
}

type originKey struct{}

// withOrigin keeps the request's scheme and host in its context: the URLs the gateway
// hands out (GetSandboxBuildLogs) point at the address the caller reached it by.
func withOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), originKey{}, scheme+"://"+r.Host)))
	})
}

func (s *Server) GetSandboxBuildLogs(ctx context.Context, req *connect.Request[sandboxv1.GetSandboxBuildLogsRequest]) (*connect.Response[sandboxv1.GetSandboxBuildLogsResponse], error) {
	m := req.Msg
	var vs []apierr.Violation
	if m.GetSandboxId() == "" {
		vs = append(vs, apierr.Violation{Field: "sandbox_id", Description: "is required"})
	}
	if m.GetService() == "" {
		vs = append(vs, apierr.Violation{Field: "service", Description: "is required (a service of the sandbox's Compose file that was built)"})
	}
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid request: "+apierr.Describe(vs), vs)
	}
	org := principal(ctx).Org
	rec, ok := s.index.get(ctx, org, m.GetSandboxId())
	if !ok {
		return nil, runner.NotFoundError(m.GetSandboxId())
	}
	if err := s.checkSource(ctx, s.index.runnerOf(rec)); err != nil {
		return nil, err
	}
	id, ok := rec.builds[m.GetService()]
	if !ok {
		built := slices.Sorted(func(yield func(string) bool) {
			for k := range rec.builds {
				if !yield(k) {
					return
				}
			}
		})
		why := "was not created from a Compose file with a service to build"
		if len(built) > 0 {
			why = "built the image of service(s) " + strings.Join(built, ", ") + " only"
		}
		svc := clipName(m.GetService())
		return nil, apierr.New(apierr.BuildNotFound, fmt.Sprintf("sandbox %s has no build of service %q: it %s (a service with build: and no image is built)", rec.id, svc, why),
			map[string]string{"sandbox_id": rec.id, "service": svc})
	}
	origin, _ := ctx.Value(originKey{}).(string)
	exp := time.Now().Add(BuildLogURLTTL).Truncate(time.Second)
	q := url.Values{"org": {org}, "build": {id}, "expires": {strconv.FormatInt(exp.Unix(), 10)},
		"token": {base64.RawURLEncoding.EncodeToString(s.shareTokens.buildLogMAC(org, id, exp.Unix()))}}
	return connect.NewResponse(&sandboxv1.GetSandboxBuildLogsResponse{Url: origin + BuildLogPath + "?" + q.Encode(), ExpireTime: timestamppb.New(exp)}), nil
}

func clipName(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}

// buildLogText serves a URL of GetSandboxBuildLogs: the build's log as it is stored now,
// as text (steps, output lines, the end). A URL expired, altered or of another key is
// 403 and says nothing of the build.
func (s *Server) buildLogText(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	org, id := q.Get("org"), q.Get("build")
	exp, err := strconv.ParseInt(q.Get("expires"), 10, 64)
	mac, merr := base64.RawURLEncoding.DecodeString(q.Get("token"))
	now := time.Now().Unix()
	if err != nil || merr != nil || exp < now || exp > now+int64(BuildLogURLTTL/time.Second)+60 || len(org) > 128 || len(id) > 128 ||
		!hmac.Equal(mac, s.shareTokens.buildLogMAC(org, id, exp)) {
		http.Error(w, "this build log URL is invalid or expired: ask GetSandboxBuildLogs for a new one", http.StatusForbidden)
		return
	}
	st, err := s.builds.store()
	if err != nil {
		http.Error(w, "this gateway keeps no builds", http.StatusNotFound)
		return
	}
	ctx := r.Context()
	if _, err := st.Get(ctx, org, id); errors.Is(err, store.ErrNotFound) {
		http.Error(w, "the build is gone", http.StatusNotFound)
		return
	} else if err != nil {
		http.Error(w, "the store is unavailable: retry", http.StatusServiceUnavailable)
		return
	}
	var b strings.Builder
	after := int64(0)
	for b.Len() < maxBuildLogText {
		evs, err := st.Events(ctx, id, after, 1000)
		if err != nil {
			http.Error(w, "the store is unavailable: retry", http.StatusServiceUnavailable)
			return
		}
		for _, e := range evs {
			after = e.Seq
			ev := &buildv1.BuildLogEvent{}
			if proto.Unmarshal(e.Event, ev) != nil {
				continue
			}
			writeBuildLogEvent(&b, ev)
		}
		if len(evs) < 1000 {
			break
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(b.String()))
}

// writeBuildLogEvent renders one event as the text of a build log.
func writeBuildLogEvent(b *strings.Builder, ev *buildv1.BuildLogEvent) {
	switch e := ev.GetEvent().(type) {
	case *buildv1.BuildLogEvent_Step:
		st := e.Step
		fmt.Fprintf(b, "STEP %d: %s\n", st.GetNumber(), st.GetInstruction())
	case *buildv1.BuildLogEvent_Line:
		if e.Line.GetStream() == buildv1.LogLine_STREAM_SYSTEM {
			b.WriteString("# ")
		}
		b.WriteString(e.Line.GetText())
		b.WriteByte('\n')
	case *buildv1.BuildLogEvent_Build:
		bd := e.Build
		if !terminalBuild(bd.GetState()) {
			return
		}
		fmt.Fprintf(b, "# build %s %s", bd.GetBuildId(), strings.TrimPrefix(bd.GetState().String(), "BUILD_STATE_"))
		if f := bd.GetFailedStep(); f != nil {
			fmt.Fprintf(b, " at step %d: %s", f.GetNumber(), f.GetInstruction())
		}
		if bd.GetImage() != "" {
			fmt.Fprintf(b, ": %s", bd.GetImage())
		}
		b.WriteByte('\n')
	}
}
