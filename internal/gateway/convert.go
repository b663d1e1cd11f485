package gateway

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/spec"
)

// toCreateRequest converts a wire spec (spec.Convert), reporting the problems of its
// runner_ids (placement's to check) with the spec's own, and looking up the snapshots its
// volumes restore with restore (nil: restores are NOT_IMPLEMENTED), the secrets its
// containers reference with secrets (nil: secret references are NOT_IMPLEMENTED) and its
// registered volumes with reg (nil: registered volumes are NOT_IMPLEMENTED).
func toCreateRequest(s *sandboxv1.SandboxSpec, restore spec.Restorer, secrets spec.SecretResolver, reg spec.RegisteredResolver) (runner.CreateRequest, error) {
	o := spec.Options{Extra: placement.RunnerIDViolations(s.GetRunnerIds()), Restore: restore, Secrets: secrets, Registered: reg}
	return spec.Convert(s, o)
}

// toProto renders a sandbox for the wire. sp is the spec as the caller sent it.
func sandboxProto(id string, sp *sandboxv1.SandboxSpec, sb runner.Sandbox, r runnerName) *sandboxv1.Sandbox {
	st := &sandboxv1.SandboxStatus{
		State:                       sandboxv1.State(sb.State),
		CreateTime:                  ts(sb.CreatedAt),
		StartTime:                   ts(sb.StartedAt),
		EndTime:                     ts(sb.EndedAt),
		EffectiveMaxLifetimeSeconds: int32(sb.Lifetime / time.Second),
		RunnerId:                    r.ID(),
		RunnerGroupId:               r.Group(),
		EffectiveRuntimeClass:       sb.RuntimeClass,
	}
	if sb.State == runner.StateUnspecified {
		// The gateway knows a sandbox only once a runner accepted it (the index records
		// it after the runner's Create answered), so a state not reported yet is
		// CREATING. PENDING (accepted, no runner yet) is a state sandboxd never has.
		st.State = sandboxv1.State_STATE_CREATING
	}
	// sp is the resolved spec, defaults included, so its rules are what the runner was
	// given; converting them again yields the enforced (case-normalized) form.
	n, _, _ := spec.ToNetwork(sp.GetNetwork())
	st.EffectiveEgress, st.EffectiveIngress = spec.EffectiveNetwork(n)
	st.EffectiveDnsEgress = sandboxv1.DNSEgressMode_DNS_EGRESS_MODE_ALLOW
	if sb.Reason != "" {
		st.StateReason = sb.Reason
		if sb.Message != "" {
			st.StateReason += ": " + sb.Message
		}
	}
	if sb.ExitCode != nil {
		c := *sb.ExitCode
		st.ExitCode = &c
	}
	// A group's: the sum of its containers, what the policy's ceilings apply to.
	st.EffectiveResources, st.EffectiveResourceRequirements = spec.EffectiveTotal(sp)
	if u := sb.Usage; u != nil && sb.State == runner.StateRunning {
		// Read from the sandbox's cgroup when its runner answered (GetSandbox); memory in
		// MiB, rounded up so that a sandbox using any shows it; GPUs are what it holds.
		st.ResourceUsage = &sandboxv1.ResourceUsage{CpuMillicores: u.CPUMillicores,
			MemoryMb: (u.MemoryBytes + 1<<20 - 1) >> 20, GpuCount: st.GetEffectiveResources().GetGpu().GetCount()}
	}
	st.ContainerStatuses = containerStatuses(sp, sb, st.State)
	sp = withPrimaryMarked(sp)
	st.AttachedVolumeIds = registeredVolumeIDs(sp)
	out := &sandboxv1.Sandbox{SandboxId: id, Spec: sp, Status: st}
	if sb.Spec.Engine != nil {
		out.Control = sandboxv1.Control_CONTROL_CONTAINER_ENGINE
	}
	return out
}

// runnerName is what a sandbox's public form says of its runner (a runner.Handle, or
// absentRunner for one this gateway does not have).
type runnerName interface {
	ID() string
	Group() string
}

// absentRunner names a runner this gateway does not have (a sandbox's record naming it
// is served from its last status: gone.go).
type absentRunner string

func (a absentRunner) ID() string  { return string(a) }
func (absentRunner) Group() string { return "" }

// toProto is the public form of a sandbox of runner r, with its services' addresses.
func (s *Server) toProto(rec *record, sb runner.Sandbox, r runnerName) *sandboxv1.Sandbox {
	p := sandboxProto(rec.id, rec.spec, sb, r)
	p.SourceTemplateId, p.SourceTemplateRevision = rec.sourceTemplateID, rec.sourceTemplateRevision
	p.DisplayName = rec.displayName
	domain, port := s.views.edgeOf(r.ID())
	p.Status.Services = spec.ServiceStatuses(rec.id, rec.spec, sb, r.ID(), domain, port)
	return p
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
