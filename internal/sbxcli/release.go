package sbxcli

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
)

// releaseCommand is `sbx admin release`: the runner releases and the channels that offer
// them (platform-wide).
func (a *app) releaseCommand() *cobra.Command {
	rel := &cobra.Command{Use: "release", Short: "Manage runner releases: publish to RAPID, promote to STABLE"}
	rel.AddCommand(a.releaseListCommand(), a.releasePublishCommand(), a.releasePromoteCommand(), a.releaseResumeCommand())
	return rel
}

func (a *app) releaseListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List releases, highest version first, and what each channel offers",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Releases.ListReleases(cmd.Context(), connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(out.Msg)
			}
			_, _ = fmt.Fprintf(a.stdout, "STABLE offers %s, RAPID offers %s\n",
				orNone(out.Msg.GetStableVersion()), orNone(out.Msg.GetRapidVersion()))
			for _, r := range out.Msg.GetRollouts() {
				_, _ = fmt.Fprintln(a.stdout, rolloutLine(r))
			}
			if len(out.Msg.GetReleases()) == 0 {
				_, err := fmt.Fprintln(a.stdout, "no releases recorded: the channels offer the versions the control plane was started with")
				return err
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "VERSION\tCHANNELS\tRAPID SINCE\tSTABLE SINCE\tBINARIES")
			for _, r := range out.Msg.GetReleases() {
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.GetVersion(), orDash(channelList(r)),
					orDash(ts(r.GetRapidTime())), orDash(ts(r.GetStableTime())), orDash(strings.Join(arches(r), ",")))
			}
			return tw.Flush()
		},
	}
}

func (a *app) releasePublishCommand() *cobra.Command {
	var r controlplanev1.Release
	var sums []string
	cmd := &cobra.Command{
		Use:   "publish VERSION --runner-image-digest sha256:… --agent-image-digest sha256:… [--checksum ARCH=SHA256]…",
		Short: "Record a release and put it on RAPID",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r.Version = args[0]
			for _, s := range sums {
				arch, sum, ok := strings.Cut(s, "=")
				if !ok || arch == "" {
					return fmt.Errorf("--checksum %q: want ARCH=SHA256, e.g. amd64=<64 hex digits>", s)
				}
				if r.BinaryChecksums == nil {
					r.BinaryChecksums = map[string]string{}
				}
				if _, dup := r.BinaryChecksums[arch]; dup {
					return fmt.Errorf("--checksum: %s given twice", arch)
				}
				r.BinaryChecksums[arch] = sum
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Releases.PublishRelease(cmd.Context(), connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: &r}))
			if err != nil {
				return err
			}
			return a.printRelease(out.Msg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&r.RunnerImageDigest, "runner-image-digest", "", "digest of the runner image (sha256:…)")
	f.StringVar(&r.AgentImageDigest, "agent-image-digest", "", "digest of the sandbox-agent image (sha256:…)")
	f.StringArrayVar(&sums, "checksum", nil, "ARCH=SHA256 of the sandboxd binary for ARCH (amd64, arm64, …); repeat per architecture")
	return cmd
}

func (a *app) releasePromoteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "promote VERSION",
		Short: "Put a release that is on RAPID on STABLE too (STABLE only moves forward)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Releases.PromoteRelease(cmd.Context(), connect.NewRequest(&controlplanev1.PromoteReleaseRequest{Version: args[0]}))
			if err != nil {
				return err
			}
			return a.printRelease(out.Msg)
		},
	}
}

func (a *app) printRelease(r *controlplanev1.Release) error {
	if a.json() {
		return a.printJSON(r)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			_, _ = fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	row("Release", r.GetVersion())
	row("Channels", channelList(r))
	row("Runner image", r.GetRunnerImageDigest())
	row("Agent image", r.GetAgentImageDigest())
	for _, arch := range arches(r) {
		row("Binary "+arch, r.GetBinaryChecksums()[arch])
	}
	row("Created", ts(r.GetCreateTime()))
	row("On RAPID since", ts(r.GetRapidTime()))
	row("On STABLE since", ts(r.GetStableTime()))
	return tw.Flush()
}

func channelList(r *controlplanev1.Release) string {
	var out []string
	for _, c := range r.GetChannels() {
		out = append(out, c.String())
	}
	return strings.Join(out, ",")
}

func arches(r *controlplanev1.Release) []string {
	var out []string
	for arch := range r.GetBinaryChecksums() {
		out = append(out, arch)
	}
	slices.Sort(out)
	return out
}

func orNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}
