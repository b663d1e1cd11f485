package sbxcli

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/release"
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
				if l := haltedOrgsLine(r); l != "" {
					_, _ = fmt.Fprintln(a.stdout, l)
				}
			}
			if len(out.Msg.GetReleases()) == 0 {
				_, err := fmt.Fprintln(a.stdout, "no releases recorded: the channels offer the versions the control plane was started with")
				return err
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "VERSION\tCHANNELS\tRAPID SINCE\tSTABLE SINCE\tBINARIES\tSIGNED")
			for _, r := range out.Msg.GetReleases() {
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.GetVersion(), orDash(channelList(r)),
					orDash(ts(r.GetRapidTime())), orDash(ts(r.GetStableTime())), orDash(strings.Join(arches(r), ",")), signedMark(r))
			}
			return tw.Flush()
		},
	}
}

func (a *app) releasePublishCommand() *cobra.Command {
	var r controlplanev1.Release
	var sums, agentSums []string
	var manifestPath, sigPath string
	cmd := &cobra.Command{
		Use: "publish VERSION --runner-image-digest sha256:… --agent-image-digest sha256:… [--checksum ARCH=SHA256]… [--agent-checksum ARCH=SHA256]…\n" +
			"  sbx admin release publish --manifest M [--signature M.sig]",
		Short: "Record a release and put it on RAPID: a record, or a signed release manifest",
		Long: "Publish a release record from flags, or a signed release manifest (sandboxd release manifest|sign):\n" +
			"a control plane started with --release-keys accepts only signed manifests, one without only records.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &controlplanev1.PublishReleaseRequest{}
			if manifestPath != "" {
				for _, name := range []string{"runner-image-digest", "agent-image-digest", "checksum", "agent-checksum"} {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s: with --manifest the release is the manifest's; give no record flags", name)
					}
				}
				var err error
				if req.Manifest, req.Signature, err = readSignedManifest(manifestPath, sigPath); err != nil {
					return err
				}
				if len(args) == 1 { // checked against the manifest's by the control plane
					req.Release = &controlplanev1.Release{Version: args[0]}
				}
			} else {
				if sigPath != "" {
					return errors.New("--signature needs --manifest")
				}
				if len(args) != 1 {
					return errors.New("publish: VERSION is required (or --manifest)")
				}
				r.Version = args[0]
				var err error
				if r.BinaryChecksums, err = parseChecksums("checksum", sums); err != nil {
					return err
				}
				if r.AgentBinaryChecksums, err = parseChecksums("agent-checksum", agentSums); err != nil {
					return err
				}
				req.Release = &r
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Releases.PublishRelease(cmd.Context(), connect.NewRequest(req))
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
	f.StringArrayVar(&agentSums, "agent-checksum", nil, "ARCH=SHA256 of the sandbox-agent binary for ARCH; repeat per architecture")
	f.StringVar(&manifestPath, "manifest", "", "a signed release manifest (sandboxd release manifest) to publish as it is")
	f.StringVar(&sigPath, "signature", "", "its signature, base64 or raw (default MANIFEST.sig, as sandboxd release sign writes it)")
	return cmd
}

// parseChecksums parses repeated ARCH=SHA256 flags (the control plane checks the values).
func parseChecksums(flagName string, specs []string) (map[string]string, error) {
	var out map[string]string
	for _, s := range specs {
		arch, sum, ok := strings.Cut(s, "=")
		if !ok || arch == "" {
			return nil, fmt.Errorf("--%s %q: want ARCH=SHA256, e.g. amd64=<64 hex digits>", flagName, s)
		}
		if out == nil {
			out = map[string]string{}
		}
		if _, dup := out[arch]; dup {
			return nil, fmt.Errorf("--%s: %s given twice", flagName, arch)
		}
		out[arch] = sum
	}
	return out, nil
}

// readSignedManifest reads a manifest (at most release.MaxManifestBytes) and its
// signature file (default MANIFEST.sig), bytes as they are: the signature is over them.
func readSignedManifest(manifestPath, sigPath string) (manifest, sig []byte, err error) {
	if sigPath == "" {
		sigPath = manifestPath + ".sig"
	}
	m, err := readBounded("manifest", manifestPath, release.MaxManifestBytes)
	if err != nil {
		return nil, nil, err
	}
	raw, err := readBounded("signature", sigPath, 1<<10)
	if err != nil {
		return nil, nil, err
	}
	manifest = []byte(m)
	if sig, err = release.DecodeSignature([]byte(raw)); err != nil {
		return nil, nil, fmt.Errorf("--signature %s: %w", sigPath, err)
	}
	return manifest, sig, nil
}

// signedMark is the SIGNED column of `release ls`: whether the release was published
// from a signed manifest (the control plane verified it; `sandboxd release verify`
// checks it again).
func signedMark(r *controlplanev1.Release) string {
	if len(r.GetManifest()) > 0 && len(r.GetManifestSignature()) > 0 {
		return "signed"
	}
	return "-"
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
	agentArches := slices.Sorted(maps.Keys(r.GetAgentBinaryChecksums()))
	for _, arch := range agentArches {
		row("Agent binary "+arch, r.GetAgentBinaryChecksums()[arch])
	}
	if signedMark(r) == "signed" {
		row("Signed", fmt.Sprintf("yes: manifest of %d bytes, Ed25519 signature (in -o json)", len(r.GetManifest())))
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
