// Package audit records the audit log (issue 24 point 3, docs/audit.md): one event per
// admin write and per sandbox lifecycle call, with who called (API key, organization,
// source address), the request ID, the procedure, its target and its result. One connect
// interceptor (Recorder.Interceptor) does it for the gateway and the control plane from
// one table (Rules) of procedure → kind and target, so no handler records anything
// itself; reads are not audited. Events go to the store after the call completed; a
// failed write is logged and never fails the call.
package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// DefaultRetention is how long events are kept unless configured (--audit-retention).
const DefaultRetention = 90 * 24 * time.Hour

// Config is the audit log's configuration.
type Config struct {
	// Retention: events older than this are pruned (every PruneInterval).
	Retention time.Duration
	// PruneInterval: how often (0: an hour).
	PruneInterval time.Duration
}

// Validate checks c without side effects.
func (c Config) Validate() error {
	switch {
	case c.Retention < time.Hour:
		return fmt.Errorf("audit retention %v: at least 1h", c.Retention)
	case c.Retention > 100*365*24*time.Hour:
		return fmt.Errorf("audit retention %v: at most 100 years", c.Retention)
	case c.PruneInterval < 0:
		return fmt.Errorf("audit prune interval %v: not negative", c.PruneInterval)
	}
	return nil
}

// Rule says how one procedure is audited: Kind names what it does, TargetType what it
// acts on; the target's ID is the first non-empty field of Request (dotted paths into
// the request message), else of Response (into the response message).
type Rule struct {
	Kind       string
	TargetType string
	Request    []string
	Response   []string
}

// OrgFields names, per procedure, the request fields that name the organization a call
// acts on, for the calls a platform admin makes on another organization's objects
// (Options.PlatformOrg); the first non-empty one counts.
var OrgFields = map[string][]string{
	quo + "SetQuota":                    {"org_id"},
	cp + "RolloutService/ResumeRollout": {"organization_id"},
	cp + "ClusterService/AddCluster":    {"cluster.organization_id"},
}

const (
	sbx  = "/coreweave.sandbox.v1.SandboxService/"
	tmpl = "/coreweave.sandbox.v1.SandboxTemplateService/"
	vol  = "/coreweave.sandbox.v1.VolumeService/"
	set  = "/coreweave.sandbox.v1.SettingsService/"
	st   = "/sandboxd.sandbox.v1.SandboxStateService/"
	quo  = "/sandboxd.quota.v1.QuotaService/"
	sec  = "/sandboxd.settings.v1.SecretService/"
	bld  = "/sandboxd.build.v1.BuildService/"
	cp   = "/sandboxd.controlplane.v1."
)

// Rules are the audited procedures. Everything else (reads, exec, files, logs, the
// runners' own registration calls) is not audited.
var Rules = map[string]Rule{
	// Sandbox lifecycle.
	sbx + "CreateSandbox":             {"sandbox.create", "sandbox", nil, []string{"sandbox_id"}},
	sbx + "CreateSandboxFromTemplate": {"sandbox.create_from_template", "sandbox", nil, []string{"sandbox_id"}},
	sbx + "CreateSandboxFromFile":     {"sandbox.create_from_file", "sandbox", nil, []string{"sandbox_id"}},
	sbx + "DeleteSandbox":             {"sandbox.delete", "sandbox", []string{"sandbox_id"}, nil},
	sbx + "PurgeSandboxes":            {"sandbox.purge", "sandbox", nil, nil},
	sbx + "ConnectSandbox":            {"sandbox.connect", "sandbox", []string{"sandbox_id"}, nil},
	sbx + "CreateFileSystemSnapshot":  {"snapshot.create", "file_system_snapshot", nil, []string{"file_system_snapshot_id"}},
	sbx + "DeleteFileSystemSnapshot":  {"snapshot.delete", "file_system_snapshot", []string{"file_system_snapshot_id"}, nil},
	st + "UpdateSandboxLifetime":      {"sandbox.update_lifetime", "sandbox", []string{"sandbox_id"}, nil},
	st + "PauseSandbox":               {"sandbox.pause", "sandbox", []string{"sandbox_id"}, nil},
	st + "ResumeSandbox":              {"sandbox.resume", "sandbox", []string{"sandbox_id"}, nil},
	st + "ForkSandbox":                {"sandbox.fork", "sandbox", []string{"sandbox_id"}, nil},
	// Templates, volumes, settings, secrets, quotas, builds.
	tmpl + "CreateSandboxTemplate":                      {"template.create", "sandbox_template", nil, []string{"sandbox_template_id"}},
	tmpl + "UpdateSandboxTemplate":                      {"template.update", "sandbox_template", []string{"sandbox_template_id"}, nil},
	tmpl + "DeleteSandboxTemplate":                      {"template.delete", "sandbox_template", []string{"sandbox_template_id"}, nil},
	vol + "CreateVolume":                                {"volume.create", "volume", nil, []string{"volume_id"}},
	vol + "UpdateVolume":                                {"volume.update", "volume", []string{"volume_id"}, nil},
	vol + "DeleteVolume":                                {"volume.delete", "volume", []string{"volume_id"}, nil},
	set + "UpdateBuildStorageConfig":                    {"settings.update_build_storage", "build_storage_config", nil, nil},
	set + "UpdateObjectStorageWifConfig":                {"settings.update_wif", "object_storage_wif_config", nil, nil},
	set + "DeleteObjectStorageWifConfig":                {"settings.delete_wif", "object_storage_wif_config", nil, nil},
	set + "UpdateFileSystemSnapshotBucketConfig":        {"settings.update_fss_bucket", "fss_bucket_config", nil, nil},
	set + "CreateSecretStore":                           {"secret_store.create", "secret_store", []string{"secret_store.name"}, []string{"name"}},
	set + "UpdateSecretStore":                           {"secret_store.update", "secret_store", []string{"secret_store.name"}, nil},
	set + "DeleteSecretStore":                           {"secret_store.delete", "secret_store", []string{"name"}, nil},
	sec + "PutSecret":                                   {"secret.put", "secret_store", []string{"store_name"}, nil},
	sec + "DeleteSecret":                                {"secret.delete", "secret_store", []string{"store_name"}, nil},
	quo + "SetQuota":                                    {"quota.set", "organization", []string{"org_id"}, nil},
	bld + "StartBuild":                                  {"build.start", "build", nil, []string{"build.build_id"}},
	bld + "CancelBuild":                                 {"build.cancel", "build", []string{"build_id"}, nil},
	cp + "RunnerManagementService/CreateManagedRunner":  {"runner.create", "runner", []string{"managed_runner.runner_id"}, []string{"runner_id"}},
	cp + "RunnerManagementService/UpdateManagedRunner":  {"runner.update", "runner", []string{"managed_runner.runner_id"}, nil},
	cp + "RunnerManagementService/DeleteManagedRunner":  {"runner.delete", "runner", []string{"runner_id"}, nil},
	cp + "RunnerManagementService/ApplyAvailableUpdate": {"runner.apply_update", "runner", []string{"runner_id"}, nil},
	cp + "RunnerManagementService/CreateBootstrapToken": {"runner.create_bootstrap_token", "runner", []string{"runner_id"}, nil},
	cp + "ApiKeyService/CreateApiKey":                   {"apikey.create", "api_key", nil, []string{"api_key.key_id"}},
	cp + "ApiKeyService/RevokeApiKey":                   {"apikey.revoke", "api_key", []string{"key_id"}, nil},
	cp + "ReleaseService/PublishRelease":                {"release.publish", "release", []string{"release.version"}, nil},
	cp + "ReleaseService/PromoteRelease":                {"release.promote", "release", []string{"version"}, nil},
	cp + "RolloutService/ResumeRollout":                 {"rollout.resume", "release_channel", []string{"channel"}, nil},
	cp + "ClusterService/AddCluster":                    {"cluster.add", "cluster", []string{"cluster.cluster_id"}, nil},
	cp + "ClusterService/DeleteCluster":                 {"cluster.delete", "cluster", []string{"cluster_id"}, nil},
}

// Options configure a Recorder.
type Options struct {
	Logger *slog.Logger
	// Source returns the caller's address for the call ctx serves (the gateway's honours
	// its trusted proxies); "" falls back to the TCP peer.
	Source func(ctx context.Context) string
	// Now is the clock (tests).
	Now func() time.Time
	// Metrics counts the writes that fail (nil: metrics.Default).
	Metrics *metrics.Metrics
	// PlatformOrg is the platform operator's organization: a call its keys make that
	// succeeds on another organization's objects (Rule.Org names it) is recorded as that
	// organization's event, with the caller's organization as its actor (ActorOrg), so
	// that organization's admins see it ("": every event is the caller's organization's).
	PlatformOrg string
}

// Recorder records audited calls into a store.
type Recorder struct {
	st  store.Audit
	log *slog.Logger
	src func(ctx context.Context) string
	now func() time.Time
	met *metrics.Metrics
	// platform is Options.PlatformOrg.
	platform string
}

// NewRecorder returns a Recorder writing to st.
func NewRecorder(st store.Audit, o Options) *Recorder {
	r := &Recorder{st: st, log: o.Logger, src: o.Source, now: o.Now, met: o.Metrics, platform: o.PlatformOrg}
	if r.met == nil {
		r.met = metrics.Default
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r
}

// writeTimeout bounds one event's write: the call has completed already.
const writeTimeout = 5 * time.Second

// maxHeaderID bounds the x-request-id a caller sends.
const maxHeaderID = 128

// Interceptor records every call of Rules. It must run outside the authenticating
// interceptor (auth.Interceptor), which tells it the caller (auth.WithSeen); calls
// without a valid API key are not recorded (nobody to attribute them to).
func (r *Recorder) Interceptor() connect.Interceptor { return interceptor{r} }

type interceptor struct{ r *Recorder }

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		rule, ok := Rules[req.Spec().Procedure]
		if !ok || req.Spec().IsClient {
			return next(ctx, req)
		}
		var who auth.Principal
		start := i.r.now()
		resp, err := next(auth.WithSeen(ctx, &who), req)
		if who.Org == "" {
			return resp, err
		}
		e := store.AuditEvent{At: start, Org: who.Org, KeyID: who.KeyID, Method: req.Spec().Procedure, Kind: rule.Kind, TargetType: rule.TargetType,
			Source: i.r.source(ctx, req.Peer().Addr), Code: "OK"}
		reqMsg, _ := req.Any().(proto.Message)
		e.RequestID = field(reqMsg, "request_id")
		if e.RequestID == "" {
			e.RequestID = headerID(req.Header())
		}
		if e.RequestID == "" {
			e.RequestID = newID()
		}
		e.TargetID = first(reqMsg, rule.Request)
		if err != nil {
			e.Code = codeName(connect.CodeOf(err))
			e.Reason = apierr.Reason(err)
			var ce *connect.Error
			if errors.As(err, &ce) {
				e.Message = ce.Message()
			} else {
				e.Message = err.Error()
			}
		} else if e.TargetID == "" && resp != nil {
			respMsg, _ := resp.Any().(proto.Message)
			e.TargetID = first(respMsg, rule.Response)
		}
		// Caller-controlled text (a body's request_id, a target ID, an error message quoting
		// the input) is stored printable only: an admin's terminal or log viewer never gets
		// a control sequence or a forged line from it.
		e.RequestID, e.TargetID, e.Message = Printable(e.RequestID), Printable(e.TargetID), Printable(e.Message)
		// A platform admin's successful call on another organization's objects is that
		// organization's event (its admins see it), made by the platform (ActorOrg; the
		// platform's admins find it by it). A refused or failed one acted on nothing: it
		// stays the caller's.
		if org := Printable(first(reqMsg, OrgFields[req.Spec().Procedure])); err == nil && org != "" && org != who.Org && i.r.platform != "" && who.Org == i.r.platform {
			e.Org, e.ActorOrg = org, who.Org
		}
		i.r.write(ctx, e)
		return resp, err
	}
}

// Printable is s with invalid UTF-8 and every non-printable rune (control characters,
// tabs and newlines, escape sequences, bidirectional overrides) escaped as \xNN or \uNNNN.
func Printable(s string) string {
	if textclip.AllPrintable(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, "\\x%02x", s[0])
		case !unicode.IsPrint(r) && r < 0x100:
			fmt.Fprintf(&b, "\\x%02x", r)
		case !unicode.IsPrint(r):
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteRune(r)
		}
		s = s[n:]
	}
	return b.String()
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler passes streams through: no audited procedure streams.
func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (r *Recorder) source(ctx context.Context, peer string) string {
	if r.src != nil {
		if s := r.src(ctx); s != "" {
			return s
		}
	}
	if h, _, err := net.SplitHostPort(peer); err == nil {
		return h
	}
	return peer
}

// write stores e, detached from the call's cancellation; a failure never fails the call:
// it is logged (WARN) and counted (cwsandbox_audit_write_failures_total).
func (r *Recorder) write(ctx context.Context, e store.AuditEvent) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if _, err := r.st.Append(wctx, e); err != nil {
		r.met.AuditWriteFailed(err)
		r.log.Warn("audit: cannot record a call", "method", e.Method, "org", e.Org, "key", e.KeyID, "request_id", e.RequestID, "err", err)
	}
}

// Prune drops the events older than retention and returns how many.
func (r *Recorder) Prune(ctx context.Context, retention time.Duration) (int64, error) {
	return r.st.DeleteBefore(ctx, r.now().Add(-retention))
}

// Run prunes every c.PruneInterval (an hour by default) until ctx ends, first at once.
func (r *Recorder) Run(ctx context.Context, c Config) {
	every := c.PruneInterval
	if every <= 0 {
		every = time.Hour
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if n, err := r.Prune(ctx, c.Retention); err != nil {
			r.log.Warn("audit: prune failed", "err", err)
		} else if n > 0 {
			r.log.Info("audit: pruned old events", "events", n, "retention", c.Retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// codeName is c as gRPC spells it: OK, PERMISSION_DENIED, …
func codeName(c connect.Code) string {
	return strings.ToUpper(c.String())
}

// headerID is the request's x-request-id header when it is short and prints.
func headerID(h http.Header) string {
	v := strings.TrimSpace(h.Get("X-Request-Id"))
	if v == "" || len(v) > maxHeaderID || strings.ContainsFunc(v, func(r rune) bool { return !unicode.IsPrint(r) || r > unicode.MaxASCII }) {
		return ""
	}
	return v
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// first is the first non-empty of the fields paths name in m.
func first(m proto.Message, paths []string) string {
	for _, p := range paths {
		if v := field(m, p); v != "" {
			return v
		}
	}
	return ""
}

// field is the value of the string or enum field at dotted path p of m ("" when absent).
func field(m proto.Message, p string) string {
	if m == nil {
		return ""
	}
	msg := m.ProtoReflect()
	names := strings.Split(p, ".")
	for i, n := range names {
		fd := msg.Descriptor().Fields().ByName(protoreflect.Name(n))
		if fd == nil || fd.IsList() || fd.IsMap() {
			return ""
		}
		if i < len(names)-1 {
			if fd.Kind() != protoreflect.MessageKind || !msg.Has(fd) {
				return ""
			}
			msg = msg.Get(fd).Message()
			continue
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			return msg.Get(fd).String()
		case protoreflect.EnumKind:
			if ev := fd.Enum().Values().ByNumber(msg.Get(fd).Enum()); ev != nil && msg.Get(fd).Enum() != 0 {
				return string(ev.Name())
			}
		}
	}
	return ""
}
