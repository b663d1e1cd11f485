package controlplane_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/rollout"
	"github.com/sandboxd/sandboxd/internal/store"
)

// rolloutStatus is runner id's status as Get shows it; List must show the same install and
// rollout fields.
func (b *releaseBed) rolloutStatus(t *testing.T, id string) *controlplanev1.ManagedRunnerStatus {
	t.Helper()
	got, err := b.svc.GetManagedRunner(b.actx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
	if err != nil {
		t.Fatal(err)
	}
	st := got.Msg.GetStatus()
	list, err := b.svc.ListManagedRunners(b.actx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.Msg.GetManagedRunners() {
		ls := r.GetStatus()
		if r.GetRunnerId() == id && (ls.GetInstallStatus() != st.GetInstallStatus() || ls.GetActiveRevision() != st.GetActiveRevision() ||
			ls.GetTargetRevision() != st.GetTargetRevision() || ls.GetRolloutInProgress() != st.GetRolloutInProgress()) {
			t.Fatalf("list and get disagree on %s: %v / %v", id, ls, st)
		}
	}
	return st
}

func wantRollout(t *testing.T, what string, st *controlplanev1.ManagedRunnerStatus, active, target string, inProgress bool) {
	t.Helper()
	if st.GetInstallStatus() != controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_SELF_MANAGED {
		t.Fatalf("%s: install_status %v, want SELF_MANAGED", what, st.GetInstallStatus())
	}
	if st.GetActiveRevision() != active || st.GetActiveRevision() != st.GetVersion() ||
		st.GetTargetRevision() != target || st.GetRolloutInProgress() != inProgress {
		t.Fatalf("%s: active_revision %q (version %q) target_revision %q rollout_in_progress %v; want %q %q %v",
			what, st.GetActiveRevision(), st.GetVersion(), st.GetTargetRevision(), st.GetRolloutInProgress(), active, target, inProgress)
	}
}

func TestRunnerRolloutStatus(t *testing.T) {
	b := newReleaseBed(t)
	heartbeat := func(id, version string, connected bool) {
		t.Helper()
		at := time.Now().UTC()
		if !connected {
			at = at.Add(-time.Hour) // long past three heartbeat intervals
		}
		rs := store.RunnerStatus{Version: version, Ready: true, LastHeartbeatAt: &at}
		if err := b.st.Runners().RecordHeartbeat(t.Context(), b.org, id, rs); err != nil {
			t.Fatal(err)
		}
	}

	// A runner created by hand, before its first heartbeat: self-managed, no active revision,
	// its channel's target, nothing rolling out.
	created, err := b.svc.CreateManagedRunner(b.actx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: "fresh", ClusterId: "c9", Zone: "z1", Policy: &structpb.Struct{}}}))
	if err != nil {
		t.Fatal(err)
	}
	wantRollout(t, "create response", created.Msg.GetStatus(), "", "v1.0.0", false)
	wantRollout(t, "before a heartbeat", b.rolloutStatus(t, "fresh"), "", "v1.0.0", false)

	// The heartbeat's version is the active revision.
	heartbeat("fresh", "v0.9.0", true)
	st := b.rolloutStatus(t, "fresh")
	wantRollout(t, "after a heartbeat", st, "v0.9.0", "v1.0.0", false)
	if !st.GetUpdateAvailable() || st.GetConnection() != controlplanev1.ConnectionStatus_CONNECTED {
		t.Fatalf("after a heartbeat: %v", st)
	}
	wantRollout(t, "stable, on its channel's version", b.rolloutStatus(t, "stable"), "v1.0.0", "v1.0.0", false)

	// A RAPID release: the channel's target is the target revision; an update is available
	// but nothing rolls out until it is applied.
	b.publish(t, "v1.1.0")
	wantRollout(t, "rapid after publish", b.rolloutStatus(t, "rapid"), "v1.0.0", "v1.1.0", false)

	// Applied: the desired version is the target revision and a rollout is in progress, in
	// the apply response as in Get and List.
	applied, err := b.svc.ApplyAvailableUpdate(b.actx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "rapid"}))
	if err != nil {
		t.Fatal(err)
	}
	wantRollout(t, "apply response", applied.Msg.GetStatus(), "v1.0.0", "v1.1.0", true)
	wantRollout(t, "rapid after apply", b.rolloutStatus(t, "rapid"), "v1.0.0", "v1.1.0", true)

	// The channel moves on: the target revision stays the applied version.
	b.publish(t, "v1.2.0")
	st = b.rolloutStatus(t, "rapid")
	wantRollout(t, "channel moved on", st, "v1.0.0", "v1.1.0", true)
	if st.GetTargetVersion() != "v1.2.0" || st.GetDesiredVersion() != "v1.1.0" {
		t.Fatalf("channel moved on: target_version %q desired_version %q", st.GetTargetVersion(), st.GetDesiredVersion())
	}

	// Heartbeats still reporting the old version, connected or not: still in progress.
	heartbeat("rapid", "v1.0.0", true)
	wantRollout(t, "connected, old version", b.rolloutStatus(t, "rapid"), "v1.0.0", "v1.1.0", true)
	heartbeat("rapid", "v1.0.0", false)
	st = b.rolloutStatus(t, "rapid")
	wantRollout(t, "disconnected, old version", st, "v1.0.0", "v1.1.0", true)
	if st.GetConnection() != controlplanev1.ConnectionStatus_DISCONNECTED {
		t.Fatalf("disconnected: %v", st)
	}

	// A heartbeat reports the desired version: the step stays in progress until the health
	// gate (internal/rollout) passes it; then the desired version is cleared, the result is
	// SUCCEEDED and the target revision is the channel's again.
	heartbeat("rapid", "v1.1.0", true)
	st = b.rolloutStatus(t, "rapid")
	wantRollout(t, "desired version reported", st, "v1.1.0", "v1.1.0", true)
	if lu := st.GetLastUpdateResult(); lu.GetState() != controlplanev1.UpdateState_UPDATE_STATE_IN_PROGRESS ||
		lu.GetFromVersion() != "v1.0.0" || lu.GetToVersion() != "v1.1.0" || lu.GetStartTime() == nil || lu.GetEndTime() != nil ||
		!lu.GetDeadline().AsTime().After(lu.GetStartTime().AsTime()) {
		t.Fatalf("last update while in progress: %v", lu)
	}
	ctl, err := rollout.New(rollout.Config{Store: rollout.FromStore(b.st), Targets: b.svc.ChannelTargets})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Tick(t.Context()); err != nil {
		t.Fatal(err)
	}
	st = b.rolloutStatus(t, "rapid")
	wantRollout(t, "health gate passed", st, "v1.1.0", "v1.2.0", false)
	if !st.GetUpdateAvailable() || st.GetDesiredVersion() != "" || st.GetLastUpdateResult().GetState() != controlplanev1.UpdateState_UPDATE_STATE_SUCCEEDED ||
		st.GetLastUpdateResult().GetEndTime() == nil {
		t.Fatalf("v1.2.0 is on RAPID, update_available should be true; desired cleared; SUCCEEDED: %v", st)
	}
}

// TestChannelTargetsArePublishedReleasesOnly: before any release is published a channel
// offers the control plane's own version to ApplyAvailableUpdate, but the automatic
// rollout's targets are empty, so upgrading the control plane moves no runner by itself;
// once a release is published the targets are the channels' releases.
func TestChannelTargetsArePublishedReleasesOnly(t *testing.T) {
	b := newReleaseBed(t)
	got, err := b.svc.ChannelTargets(t.Context())
	if err != nil || len(got) != 0 {
		t.Fatalf("ChannelTargets before any release = %v, %v; want none", got, err)
	}
	if target, _ := b.status(t, "stable"); target != "v1.0.0" {
		t.Fatalf("what STABLE offers before any release = %q, want the configured v1.0.0", target)
	}
	b.publish(t, "v1.1.0")
	got, err = b.svc.ChannelTargets(t.Context())
	if err != nil || got[store.ChannelRapid] != "v1.1.0" || got[store.ChannelStable] != "" {
		t.Fatalf("ChannelTargets after publishing v1.1.0 = %v, %v; want RAPID v1.1.0 and nothing on STABLE", got, err)
	}
}
