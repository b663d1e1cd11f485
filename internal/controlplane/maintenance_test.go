package controlplane_test

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
)

const mp = "managed_runner.maintenance_policy"

func window(cron string, d int64) *controlplanev1.MaintenanceWindow {
	return &controlplanev1.MaintenanceWindow{Cron: cron, DurationSeconds: d}
}

func exclusion(start, end time.Time, reason string) *controlplanev1.MaintenanceExclusion {
	return &controlplanev1.MaintenanceExclusion{StartTime: timestamppb.New(start), EndTime: timestamppb.New(end), Reason: reason}
}

func TestValidateMaintenancePolicy(t *testing.T) {
	t0 := time.Date(2026, 12, 24, 0, 0, 0, 0, time.UTC)
	windows := func(n int) []*controlplanev1.MaintenanceWindow {
		out := make([]*controlplanev1.MaintenanceWindow, n)
		for i := range out {
			out[i] = window("0 2 * * *", 3600)
		}
		return out
	}
	exclusions := func(n int) []*controlplanev1.MaintenanceExclusion {
		out := make([]*controlplanev1.MaintenanceExclusion, n)
		for i := range out {
			out[i] = exclusion(t0, t0.Add(time.Hour), "")
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		p      *controlplanev1.MaintenancePolicy
		fields []string // nil: valid
		stored string   // the stored JSON when valid ("" none)
	}{
		{name: "none", p: nil},
		{name: "empty is none", p: &controlplanev1.MaintenancePolicy{}},
		{name: "window and exclusion", p: &controlplanev1.MaintenancePolicy{
			Windows:    []*controlplanev1.MaintenanceWindow{window("0 2 * * 1-5", 7200)},
			Exclusions: []*controlplanev1.MaintenanceExclusion{exclusion(t0, t0.Add(72*time.Hour), "holidays")}},
			stored: `{"windows":[{"cron":"0 2 * * 1-5","duration_seconds":7200}],"exclusions":[{"start_time":"2026-12-24T00:00:00Z","end_time":"2026-12-27T00:00:00Z","reason":"holidays"}]}`},
		{name: "at the limits", p: &controlplanev1.MaintenancePolicy{Windows: windows(16), Exclusions: exclusions(64)}},
		{name: "bad cron", p: &controlplanev1.MaintenancePolicy{Windows: []*controlplanev1.MaintenanceWindow{window("0 2 * * *", 60), window("61 * * * *", 60)}},
			fields: []string{mp + ".windows[1].cron"}},
		{name: "seconds field", p: &controlplanev1.MaintenancePolicy{Windows: []*controlplanev1.MaintenanceWindow{window("0 0 2 * * *", 60)}},
			fields: []string{mp + ".windows[0].cron"}},
		{name: "time zone", p: &controlplanev1.MaintenancePolicy{Windows: []*controlplanev1.MaintenanceWindow{window("TZ=Asia/Tokyo 0 2 * * *", 60)}},
			fields: []string{mp + ".windows[0].cron"}},
		{name: "durations", p: &controlplanev1.MaintenancePolicy{Windows: []*controlplanev1.MaintenanceWindow{window("0 2 * * *", 59), window("0 2 * * *", 604801)}},
			fields: []string{mp + ".windows[0].duration_seconds", mp + ".windows[1].duration_seconds"}},
		{name: "too many windows", p: &controlplanev1.MaintenancePolicy{Windows: windows(17)}, fields: []string{mp + ".windows"}},
		{name: "too many exclusions", p: &controlplanev1.MaintenancePolicy{Exclusions: exclusions(65)}, fields: []string{mp + ".exclusions"}},
		{name: "end not after start", p: &controlplanev1.MaintenancePolicy{Exclusions: []*controlplanev1.MaintenanceExclusion{exclusion(t0, t0, "")}},
			fields: []string{mp + ".exclusions[0].end_time"}},
		{name: "start missing", p: &controlplanev1.MaintenancePolicy{Exclusions: []*controlplanev1.MaintenanceExclusion{{EndTime: timestamppb.New(t0)}}},
			fields: []string{mp + ".exclusions[0].start_time"}},
		{name: "invalid timestamp", p: &controlplanev1.MaintenancePolicy{Exclusions: []*controlplanev1.MaintenanceExclusion{{StartTime: timestamppb.New(t0), EndTime: &timestamppb.Timestamp{Seconds: 1 << 62}}}},
			fields: []string{mp + ".exclusions[0].end_time"}},
		{name: "reason too long", p: &controlplanev1.MaintenancePolicy{Exclusions: []*controlplanev1.MaintenanceExclusion{exclusion(t0, t0.Add(1), strings.Repeat("é", 129))}},
			fields: []string{mp + ".exclusions[0].reason"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &controlplanev1.ManagedRunner{RunnerId: "r1", ClusterId: "c1", Zone: "z", Policy: &structpb.Struct{}, MaintenancePolicy: tc.p}
			rec, err := controlplane.ValidateCreate(r)
			u, uerr := controlplane.ValidateUpdate(&controlplanev1.UpdateManagedRunnerRequest{ManagedRunner: r,
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"maintenancePolicy"}}})
			if tc.fields == nil {
				if err != nil || uerr != nil {
					t.Fatalf("valid policy refused: %v / %v", err, uerr)
				}
				if tc.stored != "" && string(rec.MaintenancePolicy) != tc.stored {
					t.Errorf("stored %s, want %s", rec.MaintenancePolicy, tc.stored)
				}
				if (tc.p == nil || len(tc.p.Windows)+len(tc.p.Exclusions) == 0) != (rec.MaintenancePolicy == nil) {
					t.Errorf("stored %s for %v", rec.MaintenancePolicy, tc.p)
				}
				if !u.SetMaintenancePolicy || string(u.MaintenancePolicy) != string(rec.MaintenancePolicy) || u.Policy != nil {
					t.Errorf("update %+v", u)
				}
				return
			}
			for _, e := range []error{err, uerr} {
				if connect.CodeOf(e) != connect.CodeInvalidArgument || apierr.Reason(e) != apierr.InvalidRequest {
					t.Fatalf("err = %v, want INVALID_ARGUMENT", e)
				}
				want := slices.Clone(tc.fields)
				slices.Sort(want)
				if got := fields(e); !slices.Equal(got, want) {
					t.Fatalf("violations on %v, want %v (%v)", got, want, e)
				}
			}
		})
	}
}

// FuzzValidateMaintenancePolicy: the validator never panics, names only fields of the
// maintenance policy, and what it accepts comes back from the API as it was sent.
func FuzzValidateMaintenancePolicy(f *testing.F) {
	f.Add("0 2 * * *", int64(3600), int64(1_800_000_000), int64(1_800_003_600), int32(0), "r")
	f.Add("*/5 1-3 * JAN-MAR MON", int64(60), int64(0), int64(-1), int32(-1), "")
	f.Add("@hourly", int64(604800), int64(1<<40), int64(1<<41), int32(1e9), strings.Repeat("x", 300))
	f.Fuzz(func(t *testing.T, cron string, dur, start, end int64, nanos int32, reason string) {
		p := &controlplanev1.MaintenancePolicy{
			Windows: []*controlplanev1.MaintenanceWindow{window(cron, dur)},
			Exclusions: []*controlplanev1.MaintenanceExclusion{{StartTime: &timestamppb.Timestamp{Seconds: start, Nanos: nanos},
				EndTime: &timestamppb.Timestamp{Seconds: end}, Reason: reason}},
		}
		rec, err := controlplane.ValidateCreate(&controlplanev1.ManagedRunner{RunnerId: "r1", ClusterId: "c1", Zone: "z", Policy: &structpb.Struct{}, MaintenancePolicy: p})
		if err != nil {
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("err %v", err)
			}
			for _, f := range fields(err) {
				if !strings.HasPrefix(f, mp+".") {
					t.Fatalf("violation on %s", f)
				}
			}
			return
		}
		got := controlplane.MaintenanceProto(rec.MaintenancePolicy)
		if !proto.Equal(got, p) {
			t.Fatalf("round trip: %v, want %v", got, p)
		}
	})
}

// TestMaintenancePolicyOverService: set on create, returned on get and list, replaced and
// cleared through the update mask, pinned to the etag.
func TestMaintenancePolicyOverService(t *testing.T) {
	for name, st := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			org := randomOrg(t)
			if err := controlplane.EnsureOrg(ctx, st, org); err != nil {
				t.Fatal(err)
			}
			a := auth.NewStoreAuthenticator(st, nil)
			defer a.Wait()
			svc, err := controlplane.New(controlplane.Config{Store: st, Auth: a, PlatformOrg: org, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			actx := auth.WithPrincipal(ctx, auth.Principal{Org: org, Role: auth.RoleAdmin})
			t0 := time.Date(2026, 12, 24, 0, 0, 0, 0, time.UTC)
			pol := &controlplanev1.MaintenancePolicy{Windows: []*controlplanev1.MaintenanceWindow{window("0 2 * * *", 3600)}}
			created, err := svc.CreateManagedRunner(actx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
				RunnerId: "r1", ClusterId: org + "-c", Zone: "z1", Policy: &structpb.Struct{}, MaintenancePolicy: pol}}))
			if err != nil || !proto.Equal(created.Msg.GetMaintenancePolicy(), pol) {
				t.Fatalf("create: %v %v", created, err)
			}
			got, err := svc.GetManagedRunner(actx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
			if err != nil || !proto.Equal(got.Msg.GetMaintenancePolicy(), pol) {
				t.Fatalf("get: %v %v", got, err)
			}
			list, err := svc.ListManagedRunners(actx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
			if err != nil || len(list.Msg.GetManagedRunners()) != 1 || !proto.Equal(list.Msg.GetManagedRunners()[0].GetMaintenancePolicy(), pol) {
				t.Fatalf("list: %v %v", list, err)
			}
			update := func(etag string, p *controlplanev1.MaintenancePolicy) (*connect.Response[controlplanev1.ManagedRunner], error) {
				return svc.UpdateManagedRunner(actx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
					ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", Etag: etag, MaintenancePolicy: p, DisplayName: "ignored"},
					UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"maintenance_policy"}}}))
			}
			pol2 := &controlplanev1.MaintenancePolicy{Exclusions: []*controlplanev1.MaintenanceExclusion{exclusion(t0, t0.Add(72*time.Hour), "holidays")}}
			u, err := update(created.Msg.GetEtag(), pol2)
			if err != nil || !proto.Equal(u.Msg.GetMaintenancePolicy(), pol2) || u.Msg.GetEtag() == created.Msg.GetEtag() ||
				u.Msg.GetDisplayName() != "" || u.Msg.GetPolicyRevision() != 1 {
				t.Fatalf("replace: %v %v", u, err)
			}
			if _, err := update(created.Msg.GetEtag(), nil); connect.CodeOf(err) != connect.CodeAborted {
				t.Fatalf("stale etag: %v", err)
			}
			if _, err := update("", &controlplanev1.MaintenancePolicy{Windows: []*controlplanev1.MaintenanceWindow{window("nope", 60)}}); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("invalid: %v", err)
			}
			cleared, err := update(u.Msg.GetEtag(), nil)
			if err != nil || cleared.Msg.GetMaintenancePolicy() != nil {
				t.Fatalf("clear: %v %v", cleared, err)
			}
		})
	}
}
