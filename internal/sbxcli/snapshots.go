package sbxcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

func (a *app) snapshotCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots"},
		Short:   "Snapshot scratch volumes and manage the snapshots",
		Long: `A file-system snapshot is an immutable archive of one scratch volume of a sandbox,
kept by your organization until you delete it. Start new sandboxes from it with
sbx run --volume NAME:PATH --restore NAME=SNAPSHOT, or take one as a sandbox stops
with sbx stop --snapshot-volume NAME.`,
	}
	cmd.AddCommand(a.snapshotCreateCommand(), a.snapshotLsCommand(), a.snapshotGetCommand(), a.snapshotRmCommand())
	return cmd
}

func (a *app) snapshotCreateCommand() *cobra.Command {
	var (
		volume string
		noWait bool
	)
	cmd := &cobra.Command{
		Use:   "create SANDBOX [--volume NAME] [--no-wait]",
		Short: "Snapshot a scratch volume of a running sandbox and print the snapshot's ID",
		Long: `create snapshots the scratch volume --volume (default: the sandbox's only scratch
volume) of a running sandbox, waits until the snapshot is ready (not with --no-wait)
and prints its ID.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var opts []sandbox.SnapshotOption
			if noWait {
				opts = append(opts, sandbox.NoWait())
			}
			snap, err := c.Sandbox(args[0]).Snapshot(cmd.Context(), volume, opts...)
			if err != nil {
				if snap != nil && snap.ID != "" {
					return fmt.Errorf("%w (snapshot %s)", err, snap.ID)
				}
				return err
			}
			if a.json() {
				return a.printJSON(snap.Proto())
			}
			_, err = fmt.Fprintln(a.stdout, snap.ID)
			return err
		},
	}
	cmd.Flags().StringVar(&volume, "volume", "", "the scratch volume to snapshot (default: the sandbox's only one)")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "print the ID at once, while the snapshot is still being created")
	return cmd
}

func (a *app) snapshotLsCommand() *cobra.Command {
	var opts sandbox.SnapshotListOptions
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your organization's snapshots",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.ListSnapshots(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if a.json() {
				return printJSONList(a, list, func(s *sandbox.Snapshot) protoMessage { return s.Proto() })
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "ID\tSTATE\tSIZE\tSANDBOX\tVOLUME\tTRIGGER\tAGE")
			for _, s := range list {
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.State, snapshotSize(s), dash(s.SourceSandboxID),
					dash(s.SourceVolume), s.Trigger, age(s.CreatedAt))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&opts.SourceSandboxID, "sandbox", "", "only snapshots of this sandbox")
	return cmd
}

func snapshotSize(s *sandbox.Snapshot) string {
	if s.State != sandbox.SnapshotReady {
		return "-"
	}
	return humanBytes(s.SizeBytes)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) snapshotGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show a snapshot",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.GetSnapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(s.Proto())
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			row := func(k, v string) {
				if v != "" {
					_, _ = fmt.Fprintf(tw, "%s:\t%s\n", k, v)
				}
			}
			now := time.Now()
			row("ID", s.ID)
			row("State", s.State.String())
			row("Reason", s.Reason)
			if s.State == sandbox.SnapshotReady {
				row("Size", fmt.Sprintf("%s (%d bytes)", humanBytes(s.SizeBytes), s.SizeBytes))
			}
			row("Sandbox", s.SourceSandboxID)
			row("Volume", s.SourceVolume)
			row("Trigger", s.Trigger.String())
			row("Bucket", s.Bucket)
			row("Created", humanTime(s.CreatedAt, now))
			row("Completed", humanTime(s.CompletedAt, now))
			return tw.Flush()
		},
	}
}

func (a *app) snapshotRmCommand() *cobra.Command {
	var missingOK bool
	cmd := &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete"},
		Short:   "Delete snapshots and their archives (sandboxes restored from them keep their data)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteSnapshot(cmd.Context(), id, missingOK); err != nil {
					return fmt.Errorf("delete %s: %w", id, err)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&missingOK, "missing-ok", false, "succeed if a snapshot does not exist")
	cmd.Flags().BoolVar(&missingOK, "allow-missing", false, "the same as --missing-ok (the API's name)")
	return cmd
}

// volumeFlag parses run's --volume NAME:PATH[:SIZE] into a scratch volume.
type volumeFlag struct{ to *[]sandbox.ScratchVolume }

func (v volumeFlag) String() string { return "" }
func (v volumeFlag) Type() string   { return "NAME:PATH[:SIZE]" }
func (v volumeFlag) Set(s string) error {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") {
		return fmt.Errorf("want NAME:/PATH or NAME:/PATH:SIZE (e.g. work:/work:1Gi), got %q", s)
	}
	vol := sandbox.ScratchVolume{Name: parts[0], MountPath: parts[1]}
	if len(parts) == 3 {
		if parts[2] == "" {
			return fmt.Errorf("%q: empty SIZE", s)
		}
		vol.Size = parts[2]
	}
	for _, o := range *v.to {
		if o.Name == vol.Name {
			return fmt.Errorf("volume %q is given twice", vol.Name)
		}
	}
	*v.to = append(*v.to, vol)
	return nil
}

// applyRestores sets RestoreFrom on the volumes --restore VOLUME=SNAPSHOT names; with
// several containers the volumes are mounted in the primary.
func applyRestores(spec *sandbox.Spec, restores []string) error {
	for _, r := range restores {
		name, id, ok := strings.Cut(r, "=")
		if !ok || name == "" || id == "" {
			return fmt.Errorf("--restore %q: want VOLUME=SNAPSHOT", r)
		}
		i := volumeIndex(spec.Volumes, name)
		if i < 0 {
			return fmt.Errorf("--restore %q: no volume %q: declare it with --volume %s:/PATH", r, name, name)
		}
		if spec.Volumes[i].RestoreFrom != "" {
			return fmt.Errorf("--restore: volume %q is restored twice", name)
		}
		spec.Volumes[i].RestoreFrom = id
	}
	if len(spec.Containers) > 0 && len(spec.Volumes) > 0 {
		prim := 0
		for i, c := range spec.Containers {
			if c.Primary {
				prim = i
			}
		}
		for i := range spec.Volumes {
			v := &spec.Volumes[i]
			spec.Containers[prim].Mounts = append(spec.Containers[prim].Mounts, sandbox.Mount{Volume: v.Name, Path: v.MountPath})
			v.MountPath = ""
		}
	}
	return nil
}

func volumeIndex(vs []sandbox.ScratchVolume, name string) int {
	for i, v := range vs {
		if v.Name == name {
			return i
		}
	}
	return -1
}

// stopWithSnapshots stops sb taking snapshots of volumes, waits for them unless !wait,
// and prints their IDs (also when a snapshot failed).
func (a *app) stopWithSnapshots(cmd *cobra.Command, c *sandbox.Client, sb *sandbox.Sandbox, grace time.Duration, volumes []string, wait bool) error {
	ids, err := sb.StopWithSnapshots(cmd.Context(), grace, volumes)
	if err == nil && wait {
		var errs []error
		for i, id := range ids {
			if _, werr := c.WaitSnapshot(cmd.Context(), id); werr != nil {
				errs = append(errs, fmt.Errorf("snapshot of %s: %w", volumes[min(i, len(volumes)-1)], werr))
			}
		}
		err = errors.Join(errs...)
	}
	if a.json() {
		raw, merr := protojson.Marshal(sb.Proto())
		if merr != nil {
			return errors.Join(err, merr)
		}
		if perr := a.printJSON(map[string]any{"sandbox": json.RawMessage(raw), "file_system_snapshot_ids": ids}); perr != nil {
			return errors.Join(err, perr)
		}
		return err
	}
	if sb.State().Terminal() {
		_, _ = fmt.Fprintf(a.stdout, "%s %s\n", sb.ID(), sb.State())
	}
	// The IDs are printed whatever happened after the server returned them.
	for i, id := range ids {
		vol := "?"
		if i < len(volumes) {
			vol = volumes[i]
		}
		_, _ = fmt.Fprintf(a.stdout, "snapshot %s %s\n", vol, id)
	}
	return err
}
