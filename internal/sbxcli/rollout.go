package sbxcli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/maintenance"
)

// The automatic rollout (issue 18 point 3) as the CLI shows and steers it.

// selfUpdate is whether the runner can update itself, as runner get shows it.
func selfUpdate(st *controlplanev1.ManagedRunnerStatus) string {
	if st.GetLastHeartbeatTime() == nil {
		return ""
	}
	if st.GetSelfUpdate() {
		return "yes (the automatic rollout moves it)"
	}
	return "no (the automatic rollout skips it)"
}

// selfUpdateFailure is the last version the runner refused or rolled back from and why
// ("v0.0.3: checksum mismatch …"), as its heartbeats report it; "" when none.
func selfUpdateFailure(st *controlplanev1.ManagedRunnerStatus) string {
	v := st.GetSelfUpdateFailedVersion()
	if v == "" {
		return ""
	}
	if why := st.GetSelfUpdateFailure(); why != "" {
		return v + ": " + why
	}
	return v + " (no reason given)"
}

// lastUpdate is a runner's last update step in one line.
func lastUpdate(u *controlplanev1.UpdateResult) string {
	if u == nil {
		return ""
	}
	state := strings.TrimPrefix(u.GetState().String(), "UPDATE_STATE_")
	out := fmt.Sprintf("%s %s -> %s, started %s", state, orNone(u.GetFromVersion()), u.GetToVersion(), ts(u.GetStartTime()))
	if u.GetEndTime() != nil {
		out += ", ended " + ts(u.GetEndTime())
	} else if u.GetDeadline() != nil {
		out += ", deadline " + ts(u.GetDeadline())
	}
	return out
}

// rolloutLine is a channel's rollout state for release ls.
func rolloutLine(r *controlplanev1.ChannelRollout) string {
	ch := r.GetChannel().String()
	if r.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_HALTED {
		if r.GetTargetVersion() == "" {
			return fmt.Sprintf("%s rollout: nothing to roll out", ch)
		}
		return fmt.Sprintf("%s rollout: active, runners move to %s inside their maintenance windows", ch, r.GetTargetVersion())
	}
	return fmt.Sprintf("%s rollout: HALTED at %s since %s: %s (sbx admin release resume %s)", ch, r.GetTargetVersion(),
		ts(r.GetHaltTime()), r.GetHaltReason(), ch)
}

// haltedOrgsLine is, for a platform admin, how many organizations' rollouts of a channel
// are halted ("" when none, or for anyone else: they see only their own).
func haltedOrgsLine(r *controlplanev1.ChannelRollout) string {
	n := r.GetHaltedOrganizations()
	if n == 0 {
		return ""
	}
	ch := r.GetChannel().String()
	return fmt.Sprintf("%s rollout: halted for %d organization(s) (sbx admin release resume %s [--org ORG])", ch, n, ch)
}

func (a *app) releaseResumeCommand() *cobra.Command {
	var org string
	cmd := &cobra.Command{
		Use:   "resume STABLE|RAPID [--org ORG]",
		Short: "Resume a channel's halted automatic rollout for one organization or all (platform admins)",
		Long: "A failed update step halts the channel's rollout for the runner's organization only.\n" +
			"resume lifts the halt for --org, or for every organization without it.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ch, err := parseChannel(args[0])
			if err != nil {
				return err
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Rollouts.ResumeRollout(cmd.Context(), connect.NewRequest(&controlplanev1.ResumeRolloutRequest{Channel: ch, OrganizationId: org}))
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(out.Msg)
			}
			_, err = fmt.Fprintln(a.stdout, rolloutLine(out.Msg))
			if err == nil && haltedOrgsLine(out.Msg) != "" {
				_, err = fmt.Fprintln(a.stdout, haltedOrgsLine(out.Msg))
			}
			return err
		},
	}
	cmd.Flags().StringVar(&org, "org", "", "the organization whose halt to lift (default: every organization's)")
	return cmd
}

// Maximum lengths of the maintenance flags' values, before parsing.
const maxMaintenanceFlag = 1024

// parseWindow reads --maintenance-window CRON/DURATION, e.g. '0 2 * * 6/2h': the cron
// expression (UTC) and, after its last '/', a Go duration of whole seconds.
func parseWindow(s string) (*controlplanev1.MaintenanceWindow, error) {
	if len(s) > maxMaintenanceFlag {
		return nil, fmt.Errorf("--maintenance-window: longer than %d bytes", maxMaintenanceFlag)
	}
	i := strings.LastIndex(s, "/")
	if i <= 0 {
		return nil, fmt.Errorf("--maintenance-window %q: want CRON/DURATION, e.g. '0 2 * * 6/2h'", s)
	}
	d, err := time.ParseDuration(s[i+1:])
	if err != nil || d%time.Second != 0 {
		return nil, fmt.Errorf("--maintenance-window %q: duration %q must be whole seconds, e.g. 2h or 90m", s, s[i+1:])
	}
	return &controlplanev1.MaintenanceWindow{Cron: strings.TrimSpace(s[:i]), DurationSeconds: int64(d / time.Second)}, nil
}

// parseExclusion reads --maintenance-exclusion START/END[/REASON] (RFC 3339 times).
func parseExclusion(s string) (*controlplanev1.MaintenanceExclusion, error) {
	if len(s) > maxMaintenanceFlag {
		return nil, fmt.Errorf("--maintenance-exclusion: longer than %d bytes", maxMaintenanceFlag)
	}
	parts := strings.SplitN(s, "/", 3)
	if len(parts) < 2 {
		return nil, fmt.Errorf("--maintenance-exclusion %q: want START/END[/REASON] with RFC 3339 times", s)
	}
	start, err1 := time.Parse(time.RFC3339, parts[0])
	end, err2 := time.Parse(time.RFC3339, parts[1])
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("--maintenance-exclusion %q: %w", s, err)
	}
	x := &controlplanev1.MaintenanceExclusion{StartTime: timestamppb.New(start), EndTime: timestamppb.New(end)}
	if len(parts) == 3 {
		x.Reason = parts[2]
	}
	return x, nil
}

// maintenanceFlags turns the flags into the policy to send, checked as the API checks it
// (maintenance.Validate), so a bad value fails before any request.
func maintenanceFlags(windows, exclusions []string) (*controlplanev1.MaintenancePolicy, error) {
	var p controlplanev1.MaintenancePolicy
	var mp maintenance.Policy
	for _, w := range windows {
		x, err := parseWindow(w)
		if err != nil {
			return nil, err
		}
		p.Windows = append(p.Windows, x)
		mp.Windows = append(mp.Windows, maintenance.Window{Cron: x.GetCron(), DurationSeconds: x.GetDurationSeconds()})
	}
	for _, e := range exclusions {
		x, err := parseExclusion(e)
		if err != nil {
			return nil, err
		}
		p.Exclusions = append(p.Exclusions, x)
		mp.Exclusions = append(mp.Exclusions, maintenance.Exclusion{Start: x.GetStartTime().AsTime(), End: x.GetEndTime().AsTime(), Reason: x.GetReason()})
	}
	var errs []error
	for _, v := range maintenance.Validate(mp) {
		errs = append(errs, fmt.Errorf("maintenance_policy.%s %s", v.Field, v.Description))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &p, nil
}

// runnerUpdateCommand is `sbx admin runner update`: the fields an admin may change, each
// written only when its flag is given.
func (a *app) runnerUpdateCommand() *cobra.Command {
	var etag, displayName, group, channel string
	var windows, exclusions []string
	var clearMaint bool
	cmd := &cobra.Command{
		Use:   "update RUNNER_ID [--maintenance-window 'CRON/DURATION'…] [--maintenance-exclusion START/END[/REASON]…] [--clear-maintenance]",
		Short: "Change a runner's display name, group, release channel or maintenance policy",
		Long: `Change the fields whose flags are given. The maintenance flags replace the whole
maintenance policy: --maintenance-window (repeatable) opens a window at every time the cron
expression (UTC) names for DURATION, e.g. '0 2 * * 6/2h' (Saturdays 02:00-04:00);
--maintenance-exclusion (repeatable) forbids START/END (RFC 3339) even inside a window;
--clear-maintenance removes the policy (any time). The automatic rollout updates a runner
only inside its policy; 'sbx admin runner upgrade' does not wait for it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := &controlplanev1.ManagedRunner{RunnerId: args[0], Etag: etag}
			var paths []string
			f := cmd.Flags()
			if f.Changed("display-name") {
				r.DisplayName, paths = displayName, append(paths, "display_name")
			}
			if f.Changed("runner-group-id") {
				r.RunnerGroupId, paths = group, append(paths, "runner_group_id")
			}
			if f.Changed("release-channel") {
				ch, err := parseChannel(channel)
				if err != nil {
					return err
				}
				r.ReleaseChannel, paths = ch, append(paths, "release_channel")
			}
			maint := len(windows)+len(exclusions) > 0
			if clearMaint && maint {
				return errors.New("--clear-maintenance cannot be combined with --maintenance-window or --maintenance-exclusion")
			}
			if maint {
				p, err := maintenanceFlags(windows, exclusions)
				if err != nil {
					return err
				}
				r.MaintenancePolicy = p
			}
			if maint || clearMaint {
				paths = append(paths, "maintenance_policy")
			}
			if len(paths) == 0 {
				return errors.New("nothing to update: give --display-name, --runner-group-id, --release-channel or the maintenance flags")
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Runners.UpdateManagedRunner(cmd.Context(), connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
				ManagedRunner: r, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}}))
			if err != nil {
				return err
			}
			return a.printRunner(out.Msg, runnerHealth{})
		},
	}
	f := cmd.Flags()
	f.StringVar(&etag, "etag", "", "update only if the runner still has this etag")
	f.StringVar(&displayName, "display-name", "", "a name for people")
	f.StringVar(&group, "runner-group-id", "", "runner group (empty: \"default\")")
	f.StringVar(&channel, "release-channel", "", "STABLE or RAPID")
	f.StringArrayVar(&windows, "maintenance-window", nil, "maintenance window 'CRON/DURATION' in UTC, e.g. '0 2 * * 6/2h' (repeatable; replaces the policy)")
	f.StringArrayVar(&exclusions, "maintenance-exclusion", nil, "exclusion START/END[/REASON], RFC 3339 times (repeatable; replaces the policy)")
	f.BoolVar(&clearMaint, "clear-maintenance", false, "remove the maintenance policy: any time")
	return cmd
}
