package sbxcli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

func (a *app) volumeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes"},
		Short:   "Manage your organization's registered volumes",
		Long: `A registered volume outlives sandboxes: sandboxes mount it by ID (a spec's
volumes[].volume_id) and see one shared directory. On sandboxd a volume is CLUSTER_LOCAL: one
runner holds it (an ext4 image of --size, 10Gi by default, on a local runner) and sandboxes
mounting it run there; its size counts against the organization's max_volume_bytes quota. Creating, updating and deleting volumes needs the SANDBOX_ADMIN role (docs/volumes.md).`,
	}
	cmd.AddCommand(a.volumeCreateCommand(), a.volumeLsCommand(), a.volumeGetCommand(), a.volumeRmCommand(), a.volumeValidateCommand(), a.volumeGrowCommand())
	return cmd
}

func (a *app) volumeCreateCommand() *cobra.Command {
	var src sandbox.VolumeSource
	var readOnly bool
	var description string
	cmd := &cobra.Command{
		Use:   "create ID --runner RUNNER [--claim NAME]",
		Short: "Register a volume on a runner (VALIDATING, then READY or ERROR)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if src.ClaimName == "" {
				src.ClaimName = args[0]
			}
			v, err := c.CreateVolume(cmd.Context(), args[0], src, readOnly, description)
			if err != nil {
				return err
			}
			return a.printVolume(v)
		},
	}
	f := cmd.Flags()
	f.StringVar(&src.RunnerID, "runner", "", "the runner that holds it (sbx runners)")
	f.StringVar(&src.ClaimName, "claim", "", "its name on the runner (default: the ID)")
	f.StringVar(&src.Namespace, "namespace", "default", "its namespace on the runner")
	f.StringVar(&src.SubPath, "sub-path", "", "a directory inside it that sandboxes see as its root")
	f.BoolVar(&readOnly, "read-only", false, "every mount of it is read-only")
	f.StringVar(&description, "description", "", "a description")
	f.StringVar(&src.Size, "size", "", "its size, e.g. 512Mi or 20Gi (16Mi to 1Ti; default: the runner's, 10Gi)")
	_ = cmd.MarkFlagRequired("runner")
	return cmd
}

func (a *app) volumeGrowCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "grow ID SIZE",
		Short: "Grow a READY volume to SIZE (e.g. 20Gi; never smaller), within the organization's max_volume_bytes",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.GrowVolume(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			return a.printVolume(v)
		},
	}
}

func (a *app) printVolume(v *sandboxv1.Volume) error {
	if a.json() {
		return a.printJSON(v)
	}
	st := v.GetStatus()
	pvc := v.GetSpec().GetPvc()
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	rows := [][2]string{
		{"ID", v.GetVolumeId()},
		{"State", volumeStateText(st.GetState())},
		{"Reason", st.GetStateReason()},
		{"Runner", pvc.GetRunnerId()},
		{"Claim", pvc.GetNamespace() + "/" + pvc.GetClaimName()},
		{"Sub path", pvc.GetSubPath()},
		{"Read only", yesNo(v.GetSpec().GetReadOnly())},
		{"Size", v.GetSpec().GetSize()},
		{"Capacity", st.GetCapacity()},
		{"Attached", fmt.Sprint(st.GetAttachedSandboxCount())},
		{"Description", v.GetSpec().GetDescription()},
	}
	for _, r := range rows {
		if r[1] != "" && r[1] != "/" {
			_, _ = fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
		}
	}
	return tw.Flush()
}

func volumeStateText(s sandboxv1.VolumeState) string {
	return strings.TrimPrefix(s.String(), "VOLUME_STATE_")
}

func (a *app) volumeLsCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your organization's volumes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			if a.json() {
				return printJSONList(a, list, func(v *sandboxv1.Volume) protoMessage { return v })
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "ID\tSTATE\tRUNNER\tCLAIM\tCAPACITY\tATTACHED\tDESCRIPTION")
			for _, v := range list {
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", v.GetVolumeId(), volumeStateText(v.GetStatus().GetState()),
					v.GetSpec().GetPvc().GetRunnerId(), v.GetSpec().GetPvc().GetClaimName(), v.GetStatus().GetCapacity(),
					v.GetStatus().GetAttachedSandboxCount(), v.GetSpec().GetDescription())
			}
			return tw.Flush()
		},
	}
}

func (a *app) volumeGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "get ID",
		Aliases: []string{"describe"},
		Short:   "Show a volume",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printVolume(v)
		},
	}
}

func (a *app) volumeValidateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "validate ID",
		Short: "Have the volume's runner check it again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := c.ValidateVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printVolume(v)
		},
	}
}

func (a *app) volumeRmCommand() *cobra.Command {
	var force, missingOK bool
	cmd := &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete"},
		Short:   "Delete volumes and their data (refused while sandboxes mount one, unless --force)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteVolume(cmd.Context(), id, missingOK, force); err != nil {
					return fmt.Errorf("delete %s: %w", id, err)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "delete even while sandboxes mount it (they keep their view until they end)")
	cmd.Flags().BoolVar(&missingOK, "missing-ok", false, "a volume that does not exist is no error")
	return cmd
}
