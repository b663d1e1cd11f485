package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// IndexStore is where the gateway keeps its sandbox index so that a gateway restart
// loses nothing: which organization owns a sandbox, where it runs, what was asked for,
// and its last status (terminal sandboxes stay readable for the retention window).
type IndexStore interface {
	store.Sandboxes
}

// OrgLister lists the organizations whose sandboxes to load at start.
type OrgLister interface {
	List(ctx context.Context) ([]store.Org, error)
}

// lastStatus is the part of runner.Sandbox the gateway serves once a runner has
// forgotten a sandbox.
type lastStatus struct {
	State        int       `json:"state"`
	Reason       string    `json:"reason,omitempty"`
	Message      string    `json:"message,omitempty"`
	ExitCode     *int32    `json:"exit_code,omitempty"`
	Restarts     int       `json:"restarts,omitempty"`
	OOMKills     int       `json:"oom_kills,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	StartedAt    time.Time `json:"started_at"`
	EndedAt      time.Time `json:"ended_at"`
	Lifetime     int64     `json:"lifetime_ns"`
	IP           string    `json:"ip,omitempty"`
	RuntimeClass string    `json:"runtime_class,omitempty"`
	ImageDigest  string    `json:"image_digest,omitempty"`
	// RequestDigest is the record's requestDigest (kept here: it is the gateway's own).
	RequestDigest string `json:"file_digest,omitempty"` // the name predates templates
	// DisplayName is the record's displayName (gateway-side too).
	DisplayName string `json:"display_name,omitempty"`
	// Builds is the record's builds (service -> build ID; gateway-side too).
	Builds map[string]string `json:"builds,omitempty"`
}

func toLast(sb runner.Sandbox) lastStatus {
	return lastStatus{
		State: int(sb.State), Reason: sb.Reason, Message: sb.Message, ExitCode: sb.ExitCode, Restarts: sb.Restarts, OOMKills: sb.OOMKills,
		CreatedAt: sb.CreatedAt, StartedAt: sb.StartedAt, EndedAt: sb.EndedAt, Lifetime: int64(sb.Lifetime),
		IP: sb.IP, RuntimeClass: sb.RuntimeClass, ImageDigest: sb.ImageDigest,
	}
}

func (l lastStatus) sandbox(id string) runner.Sandbox {
	return runner.Sandbox{
		ID: id, State: runner.State(l.State), Reason: l.Reason, Message: l.Message, ExitCode: l.ExitCode, Restarts: l.Restarts, OOMKills: l.OOMKills,
		CreatedAt: l.CreatedAt, StartedAt: l.StartedAt, EndedAt: l.EndedAt, Lifetime: time.Duration(l.Lifetime),
		IP: l.IP, RuntimeClass: l.RuntimeClass, ImageDigest: l.ImageDigest,
	}
}

// storeRecord renders r for the store.
func storeRecord(r *record, requestID string) (store.Sandbox, error) {
	spec, err := protojson.Marshal(r.spec)
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("encode spec: %w", err)
	}
	last := toLast(r.last)
	last.RequestDigest, last.DisplayName, last.Builds = r.requestDigest, r.displayName, r.builds
	status, err := json.Marshal(last)
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("encode status: %w", err)
	}
	return store.Sandbox{
		ID: r.id, Org: r.org, RunnerID: r.runnerID, RequestID: requestID, Spec: spec, Tags: r.spec.GetTags(),
		CreatedAt: r.createdAt, State: r.last.State.String(), PolicyRevision: r.policyRevision, Status: status,
		SourceTemplateID: r.sourceTemplateID, SourceTemplateRevision: r.sourceTemplateRevision,
		MilliCPU: r.need.MilliCPU, MemoryBytes: r.need.MemoryBytes, ReservationID: r.reservation,
		VolumeIDs: registeredVolumeIDs(r.spec),
	}, nil
}

// fromStore rebuilds a record.
func fromStore(s store.Sandbox) (*record, error) {
	spec := &sandboxv1.SandboxSpec{}
	if err := protojson.Unmarshal(s.Spec, spec); err != nil {
		return nil, fmt.Errorf("sandbox %s: decode spec: %w", s.ID, err)
	}
	var last lastStatus
	if len(s.Status) > 0 {
		if err := json.Unmarshal(s.Status, &last); err != nil {
			return nil, fmt.Errorf("sandbox %s: decode status: %w", s.ID, err)
		}
	}
	return &record{id: s.ID, org: s.Org, runnerID: s.RunnerID, spec: spec, createdAt: s.CreatedAt, last: last.sandbox(s.ID), policyRevision: s.PolicyRevision,
		requestDigest: last.RequestDigest, sourceTemplateID: s.SourceTemplateID, sourceTemplateRevision: s.SourceTemplateRevision,
		displayName: last.DisplayName, builds: last.Builds, need: needOf(s)}, nil
}

// load fills the index with every organization's records from st.
func (x *index) load(ctx context.Context, orgs OrgLister) error {
	list, err := orgs.List(ctx)
	if err != nil {
		return fmt.Errorf("load sandbox index: %w", err)
	}
	for _, o := range list {
		token := ""
		for {
			page, next, err := x.st.List(ctx, o.ID, store.SandboxFilter{IncludeTerminal: true}, store.Page{Size: store.MaxPageSize, Token: token})
			if err != nil {
				return fmt.Errorf("load sandbox index of %s: %w", o.ID, err)
			}
			for _, s := range page {
				r, err := fromStore(s)
				if err != nil {
					return err
				}
				x.byID[r.id] = r
				if s.RequestID != "" {
					x.byRequest[r.org+"\x00"+s.RequestID] = r.id
				}
			}
			if next == "" {
				break
			}
			token = next
		}
	}
	return nil
}

// persistNew writes a new record; the index is only changed once the store has it.
func (x *index) persistNew(ctx context.Context, r *record, requestID string) error {
	if x.st == nil {
		return nil
	}
	s, err := storeRecord(r, requestID)
	if err != nil {
		return err
	}
	if _, err := x.st.Create(ctx, s); err != nil {
		var dup *store.AlreadyExistsError
		if errors.As(err, &dup) && dup.Key == store.KeyID {
			// Recorded already (a retried write) only when the stored row is this one's:
			// another organization's, runner's or request's row keeps the ID.
			if cur, gerr := x.st.Get(ctx, s.Org, s.ID); gerr == nil && cur.RunnerID == s.RunnerID && cur.RequestID == s.RequestID {
				return nil
			}
		}
		return fmt.Errorf("record sandbox %s: %w", r.id, err)
	}
	return nil
}

// persistStatus writes a changed status; failures are logged by the caller and retried on
// the next change.
func (x *index) persistStatus(ctx context.Context, r *record, sb runner.Sandbox) error {
	if x.st == nil {
		return nil
	}
	u, err := statusUpdate(r, sb)
	if err != nil {
		return err
	}
	_, err = x.st.UpdateStatus(ctx, r.org, r.id, u)
	return err
}

// statusUpdate is the store's update of r to status sb.
func statusUpdate(r *record, sb runner.Sandbox) (store.SandboxStatusUpdate, error) {
	last := toLast(sb)
	last.RequestDigest, last.DisplayName, last.Builds = r.requestDigest, r.displayName, r.builds
	status, err := json.Marshal(last)
	if err != nil {
		return store.SandboxStatusUpdate{}, err
	}
	u := store.SandboxStatusUpdate{State: sb.State.String(), Status: status}
	if sb.State.Terminal() {
		end := sb.EndedAt
		if end.IsZero() {
			end = time.Now()
		}
		u.EndedAt = &end
	}
	return u, nil
}

// changed reports whether b differs from a in what the store keeps.
func changed(a, b runner.Sandbox) bool {
	return a.State != b.State || a.Restarts != b.Restarts || a.OOMKills != b.OOMKills || !a.StartedAt.Equal(b.StartedAt) ||
		!a.EndedAt.Equal(b.EndedAt) || (a.ExitCode == nil) != (b.ExitCode == nil) || (a.ExitCode != nil && *a.ExitCode != *b.ExitCode)
}
