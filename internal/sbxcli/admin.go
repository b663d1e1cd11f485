package sbxcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/maintenance"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// adminCommand is `sbx admin`: runners, their policies, API keys and runner releases
// (role SANDBOX_ADMIN).
func (a *app) adminCommand() *cobra.Command {
	adm := &cobra.Command{
		Use:   "admin",
		Short: "Manage runners, policies, API keys and releases (needs a SANDBOX_ADMIN key)",
	}
	runner := &cobra.Command{Use: "runner", Short: "Manage runners and their policies"}
	runner.AddCommand(a.runnerCreateCommand(), a.runnerGetCommand(), a.runnerListCommand(),
		a.runnerDeleteCommand(), a.runnerUpgradeCommand(), a.policyCommand(), a.runnerUpdateCommand())
	keys := &cobra.Command{Use: "apikey", Short: "Manage API keys"}
	keys.AddCommand(a.keyCreateCommand(), a.keyListCommand(), a.keyRevokeCommand())
	adm.AddCommand(runner, keys, a.releaseCommand())
	adm.AddCommand(a.clusterCommand())
	adm.AddCommand(a.quotaAdminCommand())
	adm.AddCommand(a.auditCommand())
	return adm
}

func (a *app) admin() (*sandbox.Admin, error) {
	adm, err := sandbox.NewAdmin(a.baseURL, a.apiKey, a.clientOptions()...)
	if errors.Is(err, sandbox.ErrNoBaseURL) {
		return nil, errNoEndpoint
	}
	return adm, err
}

// readPolicy reads a policy document, YAML or JSON, from path ("-" is stdin).
func (a *app) readPolicy(path string) (*structpb.Struct, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(a.stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	return parsePolicy(path, b)
}

// parsePolicy parses a YAML or JSON (JSON is YAML) policy document, which must be a
// mapping: {} is the permissive policy.
func parsePolicy(name string, b []byte) (*structpb.Struct, error) {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	t := bytes.TrimSpace(j)
	if len(t) == 0 || t[0] != '{' {
		return nil, fmt.Errorf("policy %s: the document must be a mapping ({} is the permissive policy)", name)
	}
	var p structpb.Struct
	if err := protojson.Unmarshal(t, &p); err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	return &p, nil
}

func (a *app) runnerCreateCommand() *cobra.Command {
	var r controlplanev1.ManagedRunner
	var channel, policyFile string
	cmd := &cobra.Command{
		Use:   "create RUNNER_ID --cluster-id ID --zone ZONE [-f POLICY.json]",
		Short: "Register a runner (one per cluster) with its policy",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r.RunnerId = args[0]
			ch, err := parseChannel(channel)
			if err != nil {
				return err
			}
			r.ReleaseChannel = ch
			if policyFile == "" {
				r.Policy = &structpb.Struct{}
			} else if r.Policy, err = a.readPolicy(policyFile); err != nil {
				return err
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Runners.CreateManagedRunner(cmd.Context(), connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &r}))
			if err != nil {
				return err
			}
			return a.printRunner(out.Msg, runnerHealth{})
		},
	}
	f := cmd.Flags()
	f.StringVar(&r.ClusterId, "cluster-id", "", "the cluster the runner serves (one runner per cluster)")
	f.StringVar(&r.Zone, "zone", "", "the cluster's zone, lowercase")
	f.StringVar(&r.RunnerGroupId, "runner-group-id", "", "runner group (default \"default\")")
	f.StringVar(&r.DisplayName, "display-name", "", "a name for people")
	f.StringVar(&channel, "release-channel", "STABLE", "STABLE or RAPID")
	f.StringVarP(&policyFile, "file", "f", "", "policy document (JSON; - for stdin); default {} (permissive)")
	return cmd
}

func parseChannel(s string) (controlplanev1.ReleaseChannel, error) {
	switch strings.ToUpper(s) {
	case "", "STABLE":
		return controlplanev1.ReleaseChannel_STABLE, nil
	case "RAPID":
		return controlplanev1.ReleaseChannel_RAPID, nil
	}
	return 0, fmt.Errorf("--release-channel must be STABLE or RAPID, not %q", s)
}

func (a *app) getRunner(cmd *cobra.Command, id string) (*controlplanev1.ManagedRunner, error) {
	adm, err := a.admin()
	if err != nil {
		return nil, err
	}
	out, err := adm.Runners.GetManagedRunner(cmd.Context(), connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
	if err != nil {
		return nil, err
	}
	return out.Msg, nil
}

func (a *app) runnerGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "get RUNNER_ID",
		Aliases: []string{"describe"},
		Short:   "Show a runner: fields, status and etag",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.getRunner(cmd, args[0])
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(r)
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			h, ok := runnerHealths(cmd.Context(), adm)[r.GetRunnerId()]
			if !ok {
				h = runnerHealth{state: "unknown (the gateway does not place on it, or serves no discovery)"}
			}
			return a.printRunner(r, h)
		},
	}
}

func (a *app) printRunner(r *controlplanev1.ManagedRunner, h runnerHealth) error {
	if a.json() {
		return a.printJSON(r)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			_, _ = fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	st := r.GetStatus()
	row("Runner", r.GetRunnerId())
	row("Cluster", r.GetClusterId())
	row("Zone", r.GetZone())
	row("Group", r.GetRunnerGroupId())
	row("Display name", r.GetDisplayName())
	row("Release channel", r.GetReleaseChannel().String())
	row("Connection", st.GetConnection().String())
	row("Ready", fmt.Sprint(st.GetReady()))
	row("Health", shown(h.state))
	row("Health reason", shown(h.reason))
	row("Last heartbeat", ts(st.GetLastHeartbeatTime()))
	row("Install status", installStatus(st.GetInstallStatus()))
	row("Install namespace", st.GetInstallNamespace())
	if e := st.GetInstallError(); e != nil {
		row("Install error", e.GetReason()+": "+e.GetMessage())
		for _, h := range e.GetHints() {
			row("Hint", h)
		}
	}
	row("Version", st.GetVersion())
	if st.GetUpdateAvailable() {
		row("Update available", st.GetTargetVersion())
	}
	row("Desired version", st.GetDesiredVersion())
	row("Active revision", st.GetActiveRevision())
	row("Target revision", st.GetTargetRevision())
	row("Rollout in progress", fmt.Sprint(st.GetRolloutInProgress()))
	row("Self-update", selfUpdate(st))
	row("Self-update failure", selfUpdateFailure(st))
	row("Last update", lastUpdate(st.GetLastUpdateResult()))
	row("Last update reason", st.GetLastUpdateResult().GetReason())
	row("Rollout halted", st.GetRolloutHaltReason())
	if c := st.GetCapacity(); c != nil {
		u := st.GetUsage()
		row("CPU", humanMilliCPU(u.GetMilliCpu())+" used of "+humanMilliCPU(c.GetMilliCpu()))
		row("Memory", humanBytes(u.GetMemoryBytes())+" used of "+humanBytes(c.GetMemoryBytes()))
		row("Sandboxes", fmt.Sprint(u.GetSandboxes()))
	}
	row("Image pre-pull", prepullSummary(st.GetPrepull()))
	for _, im := range st.GetPrepull().GetImages() {
		row("  Image", prepullImageLine(im))
	}
	policy := "never set"
	if r.GetPolicy() != nil {
		policy = fmt.Sprintf("revision %d (sbx admin runner policy get %s)", r.GetPolicyRevision(), r.GetRunnerId())
	}
	row("Policy", policy)
	printMaintenance(tw, r.GetMaintenancePolicy(), time.Now())
	row("Etag", r.GetEtag())
	row("Created", ts(r.GetCreateTime()))
	row("Updated", ts(r.GetUpdateTime()))
	return tw.Flush()
}

// runnerHealth is a runner's health as the gateway shows the key's organization: the
// worse of the runner's state for everyone and the organization's own record
// (docs/observability.md).
type runnerHealth struct{ state, reason string }

// The discovery tags of runner health (gateway.TagHealth, gateway.TagHealthReason).
const (
	tagHealth       = "sandboxd.health="
	tagHealthReason = "sandboxd.health.reason="
)

// maxDiscoveryPages bounds a listing of the gateway's runners.
const maxDiscoveryPages = 100

// runnerHealths reads the runners' health from the gateway's discovery
// (ListAvailableRunners, its health tags; a runner without them is healthy); nil when
// the endpoint serves no discovery (a control plane alone): health unknown. The strings
// are the server's: print them through shown.
func runnerHealths(ctx context.Context, adm *sandbox.Admin) map[string]runnerHealth {
	var out map[string]runnerHealth
	token := ""
	for range maxDiscoveryPages {
		res, err := adm.Discovery.ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{PageToken: token}))
		if err != nil {
			return out
		}
		if out == nil {
			out = map[string]runnerHealth{}
		}
		for _, r := range res.Msg.GetRunners() {
			h := runnerHealth{state: "healthy"}
			for _, tag := range r.GetTags() {
				if v, ok := strings.CutPrefix(tag, tagHealth); ok {
					h.state = v
				} else if v, ok := strings.CutPrefix(tag, tagHealthReason); ok {
					h.reason = v
				}
			}
			out[r.GetRunnerId()] = h
		}
		if token = res.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	return out
}

// installStatus is s without its RUNNER_INSTALL_STATUS_ prefix (SELF_MANAGED, …); "" when
// unspecified.
func installStatus(s controlplanev1.RunnerInstallStatus) string {
	if s == controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(s.String(), "RUNNER_INSTALL_STATUS_")
}

// rollout is a runner's rollout column in runner ls: the version it is moving to, or "-".
func rollout(st *controlplanev1.ManagedRunnerStatus) string {
	if st.GetRolloutInProgress() {
		return "to " + st.GetTargetRevision()
	}
	return "-"
}

// printMaintenance prints the maintenance policy (windows and exclusions, in UTC as they
// are evaluated) and whether now is inside it: the automatic rollout updates the runner only then.
func printMaintenance(w io.Writer, p *controlplanev1.MaintenancePolicy, now time.Time) {
	if len(p.GetWindows())+len(p.GetExclusions()) == 0 {
		_, _ = fmt.Fprintf(w, "Maintenance:\tany time (no maintenance policy)\n")
		return
	}
	key := "Maintenance windows:"
	if len(p.GetWindows()) == 0 {
		_, _ = fmt.Fprintf(w, "%s\tany time\n", key)
	}
	var mp maintenance.Policy
	for _, x := range p.GetWindows() {
		d := time.Duration(x.GetDurationSeconds()) * time.Second
		_, _ = fmt.Fprintf(w, "%s\t%s (UTC) for %s\n", key, x.GetCron(), d)
		key = ""
		mp.Windows = append(mp.Windows, maintenance.Window{Cron: x.GetCron(), DurationSeconds: x.GetDurationSeconds()})
	}
	key = "Exclusions:"
	for _, x := range p.GetExclusions() {
		start, end := x.GetStartTime().AsTime().UTC(), x.GetEndTime().AsTime().UTC()
		reason := ""
		if x.GetReason() != "" {
			reason = " (" + x.GetReason() + ")"
		}
		_, _ = fmt.Fprintf(w, "%s\t%s to %s%s\n", key, start.Format(time.RFC3339), end.Format(time.RFC3339), reason)
		key = ""
		mp.Exclusions = append(mp.Exclusions, maintenance.Exclusion{Start: start, End: end, Reason: x.GetReason()})
	}
	now = now.UTC()
	ok, next := maintenance.Allowed(mp, now)
	state := "inside a maintenance window"
	switch {
	case ok:
	case next.IsZero():
		state = "outside; no next window found"
	default:
		state = "outside; next window at " + next.Format(time.RFC3339)
	}
	_, _ = fmt.Fprintf(w, "Maintenance now:\t%s (the automatic rollout updates the runner only inside)\n", state)
}

func ts(t *timestamppb.Timestamp) string {
	if t == nil {
		return ""
	}
	return t.AsTime().Local().Format(time.RFC3339)
}

func (a *app) runnerListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List runners",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			all, err := adm.ListRunners(cmd.Context())
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(&controlplanev1.ListManagedRunnersResponse{ManagedRunners: all})
			}
			healths := runnerHealths(cmd.Context(), adm)
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "RUNNER\tCLUSTER\tZONE\tGROUP\tCHANNEL\tINSTALL\tCONNECTION\tVERSION\tTARGET\tROLLOUT\tPOLICY\tHEALTH")
			for _, r := range all {
				policy := "-"
				if r.GetPolicy() != nil {
					policy = fmt.Sprintf("rev %d", r.GetPolicyRevision())
				}
				st := r.GetStatus()
				health := "-"
				if h, ok := healths[r.GetRunnerId()]; ok {
					health = shown(h.state)
				}
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.GetRunnerId(), r.GetClusterId(), r.GetZone(),
					r.GetRunnerGroupId(), r.GetReleaseChannel(), orDash(installStatus(st.GetInstallStatus())), st.GetConnection(),
					orDash(st.GetActiveRevision()), orDash(st.GetTargetRevision()), rollout(st), policy, health)
			}
			return tw.Flush()
		},
	}
}

func (a *app) runnerDeleteCommand() *cobra.Command {
	var etag string
	var force bool
	cmd := &cobra.Command{
		Use:   "delete RUNNER_ID",
		Short: "Delete a runner (refused while it owns live sandboxes unless --force)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			if _, err := adm.Runners.DeleteManagedRunner(cmd.Context(), connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: args[0], Etag: etag, Force: force})); err != nil {
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "runner %s deleted\n", args[0])
			return err
		},
	}
	cmd.Flags().StringVar(&etag, "etag", "", "delete only if the runner still has this etag")
	cmd.Flags().BoolVar(&force, "force", false, "delete even while the runner owns live sandboxes (they keep running)")
	return cmd
}

func (a *app) runnerUpgradeCommand() *cobra.Command {
	var etag string
	cmd := &cobra.Command{
		Use:   "upgrade RUNNER_ID",
		Short: "Apply the update the runner's release channel offers",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Runners.ApplyAvailableUpdate(cmd.Context(), connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: args[0], Etag: etag}))
			if err != nil {
				return err
			}
			return a.printRunner(out.Msg, runnerHealth{})
		},
	}
	cmd.Flags().StringVar(&etag, "etag", "", "apply only if the runner still has this etag")
	return cmd
}

func (a *app) policyCommand() *cobra.Command {
	pol := &cobra.Command{Use: "policy", Short: "Read and replace a runner's policy document"}
	pol.AddCommand(&cobra.Command{
		Use:   "get RUNNER_ID",
		Short: "Print the policy (JSON; null when never set); its etag goes to stderr",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.getRunner(cmd, args[0])
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(map[string]any{"runner_id": r.GetRunnerId(), "policy": policyValue(r.GetPolicy()),
					"policy_revision": r.GetPolicyRevision(), "etag": r.GetEtag()})
			}
			_, _ = fmt.Fprintf(a.stderr, "etag: %s (policy revision %d)\n", r.GetEtag(), r.GetPolicyRevision())
			b, err := json.MarshalIndent(policyValue(r.GetPolicy()), "", "  ")
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "%s\n", b)
			return err
		},
	})
	var file, etag string
	set := &cobra.Command{
		Use:   "set RUNNER_ID -f FILE",
		Short: "Replace the whole policy document (JSON; -f - reads stdin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return errors.New("-f FILE is required (- for stdin)")
			}
			p, err := a.readPolicy(file)
			if err != nil {
				return err
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Runners.UpdateManagedRunner(cmd.Context(), connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
				ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: args[0], Policy: p, Etag: etag},
				UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
			}))
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(out.Msg)
			}
			_, err = fmt.Fprintf(a.stdout, "policy of runner %s set (revision %d, etag %s)\n", args[0], out.Msg.GetPolicyRevision(), out.Msg.GetEtag())
			return err
		},
	}
	set.Flags().StringVarP(&file, "file", "f", "", "policy document (YAML or JSON; - for stdin)")
	set.Flags().StringVar(&etag, "etag", "", "replace only if the runner still has this etag (from `policy get`)")
	pol.AddCommand(set, a.policyEditCommand())
	return pol
}

// policyEditCommand opens the policy in $EDITOR (YAML) and sets it, pinned to the etag
// it was read at, so a concurrent change is never overwritten.
func (a *app) policyEditCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "edit RUNNER_ID",
		Short: "Edit the policy in $EDITOR and replace it if nobody changed it meanwhile",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.getRunner(cmd, args[0])
			if err != nil {
				return err
			}
			j, err := json.Marshal(policyValue(r.GetPolicy()))
			if err != nil {
				return err
			}
			doc, err := yaml.JSONToYAML(j)
			if err != nil {
				return err
			}
			f, err := os.CreateTemp("", "sbx-policy-*.yaml")
			if err != nil {
				return err
			}
			defer func() { _ = os.Remove(f.Name()) }()
			header := fmt.Sprintf("# Policy of runner %s (revision %d). Save and quit to apply; an empty file cancels.\n", args[0], r.GetPolicyRevision())
			if _, err := f.WriteString(header + string(doc)); err != nil {
				return err
			}
			_ = f.Close()
			editor := os.Getenv("EDITOR")
			if editor == "" {
				editor = "vi"
			}
			ed := exec.CommandContext(cmd.Context(), "sh", "-c", editor+` "$1"`, "sh", f.Name())
			ed.Stdin, ed.Stdout, ed.Stderr = os.Stdin, a.stdout, a.stderr
			if err := ed.Run(); err != nil {
				return fmt.Errorf("editor: %w", err)
			}
			edited, err := os.ReadFile(f.Name())
			if err != nil {
				return err
			}
			if len(bytes.TrimSpace(edited)) == 0 {
				_, err = fmt.Fprintln(a.stderr, "empty file: policy unchanged")
				return err
			}
			p, err := parsePolicy(f.Name(), edited)
			if err != nil {
				return err
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Runners.UpdateManagedRunner(cmd.Context(), connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
				ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: args[0], Policy: p, Etag: r.GetEtag()},
				UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
			}))
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "policy of runner %s set (revision %d, etag %s)\n", args[0], out.Msg.GetPolicyRevision(), out.Msg.GetEtag())
			return err
		},
	}
}

// policyValue is the policy as a JSON value: nil (null) when never set.
func policyValue(p *structpb.Struct) any {
	if p == nil {
		return nil
	}
	return p.AsMap()
}

func (a *app) keyCreateCommand() *cobra.Command {
	var name, role string
	cmd := &cobra.Command{
		Use:   "create [--name NAME] [--role user|admin]",
		Short: "Issue an API key; its secret is printed once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &controlplanev1.CreateApiKeyRequest{DisplayName: name, Role: controlplanev1.Role_SANDBOX_USER}
			switch strings.ToLower(role) {
			case "user", "sandbox_user":
			case "admin", "sandbox_admin":
				req.Role = controlplanev1.Role_SANDBOX_ADMIN
			default:
				return fmt.Errorf("--role must be user or admin, not %q", role)
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.APIKeys.CreateApiKey(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(out.Msg)
			}
			_, err = fmt.Fprintln(a.stdout, out.Msg.GetSecret())
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a name to recognise the key by")
	cmd.Flags().StringVar(&role, "role", "user", "user (sandboxes) or admin (also runners, policies, keys)")
	return cmd
}

func (a *app) keyListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List API keys (revoked ones too)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			all, err := adm.ListAPIKeys(cmd.Context())
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(&controlplanev1.ListApiKeysResponse{ApiKeys: all})
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "KEY ID\tNAME\tROLE\tCREATED\tLAST USED\tREVOKED")
			for _, k := range all {
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.GetKeyId(), k.GetDisplayName(), k.GetRole(),
					ts(k.GetCreateTime()), orDash(ts(k.GetLastUsedTime())), orDash(ts(k.GetRevokeTime())))
			}
			return tw.Flush()
		},
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) keyRevokeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "revoke KEY_ID",
		Short: "Revoke an API key at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.APIKeys.RevokeApiKey(cmd.Context(), connect.NewRequest(&controlplanev1.RevokeApiKeyRequest{KeyId: args[0]}))
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(out.Msg)
			}
			_, err = fmt.Fprintf(a.stdout, "API key %s revoked\n", args[0])
			return err
		},
	}
}
