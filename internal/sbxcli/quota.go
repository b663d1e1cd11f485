package sbxcli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	quotav1 "github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1"
	"github.com/sandboxd/sandboxd/internal/quantity"
)

// quotaCommand is `sbx quota`: the caller's organization's usage against its quota.
func (a *app) quotaCommand() *cobra.Command {
	var org string
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Show the organization's quota usage (sandboxes, CPU, memory, volumes, snapshots) against its limits",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Quotas.GetQuotaUsage(cmd.Context(), connect.NewRequest(&quotav1.GetQuotaUsageRequest{OrgId: org}))
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(out.Msg)
			}
			u, e := out.Msg, out.Msg.GetEffective()
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintf(tw, "ORGANIZATION\t%s\n", u.GetOrgId())
			_, _ = fmt.Fprintln(tw, "QUOTA\tUSED\tLIMIT\tIN FLIGHT")
			_, _ = fmt.Fprintf(tw, "sandboxes\t%d\t%s\t%d\n", u.GetSandboxes(), limitText(e.MaxSandboxes, func(v int64) string { return strconv.FormatInt(v, 10) }), u.GetReservedSandboxes())
			_, _ = fmt.Fprintf(tw, "cpu\t%s\t%s\t%s\n", quantity.FormatCPU(u.GetCpuMillicores()), limitText(e.MaxCpuMillicores, quantity.FormatCPU), quantity.FormatCPU(u.GetReservedCpuMillicores()))
			_, _ = fmt.Fprintf(tw, "memory\t%s\t%s\t%s\n", quantity.FormatMemory(u.GetMemoryBytes()), limitText(e.MaxMemoryBytes, quantity.FormatMemory), quantity.FormatMemory(u.GetReservedMemoryBytes()))
			_, _ = fmt.Fprintf(tw, "volume bytes\t%s (%d volumes)\t%s\t-\n", quantity.FormatMemory(u.GetVolumeBytes()), u.GetVolumes(), limitText(e.MaxVolumeBytes, quantity.FormatMemory))
			if u.GetMaxSnapshots() != 0 {
				_, _ = fmt.Fprintf(tw, "snapshots\t%d\t%s\t-\n", u.GetSnapshots(), limitText(e.MaxSnapshots, func(v int64) string { return strconv.FormatInt(v, 10) }))
				_, _ = fmt.Fprintf(tw, "snapshot bytes\t%s\t%s\t-\n", quantity.FormatMemory(u.GetSnapshotBytes()), limitText(e.MaxSnapshotBytes, quantity.FormatMemory))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&org, "org", "", "another organization (an admin key of the platform organization only)")
	return cmd
}

// quotaAdminCommand is `sbx admin quota`.
func (a *app) quotaAdminCommand() *cobra.Command {
	q := &cobra.Command{Use: "quota", Short: "Read and set organizations' quotas (setting needs an admin key of the platform organization)"}
	q.AddCommand(a.quotaGetCommand(), a.quotaSetCommand())
	return q
}

func (a *app) quotaGetCommand() *cobra.Command {
	var org string
	cmd := &cobra.Command{
		Use:   "get --org ORG",
		Short: "Show an organization's quota: as set, and effective (unset limits take the gateway's defaults)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if org == "" {
				return fmt.Errorf("--org is required")
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Quotas.GetQuota(cmd.Context(), connect.NewRequest(&quotav1.GetQuotaRequest{OrgId: org}))
			if err != nil {
				return err
			}
			return a.printQuota(out.Msg)
		},
	}
	cmd.Flags().StringVar(&org, "org", "", "the organization")
	return cmd
}

func (a *app) quotaSetCommand() *cobra.Command {
	var org, sandboxes, cpu, memory, volumeBytes, snapshots, snapshotBytes string
	cmd := &cobra.Command{
		Use:   "set --org ORG [--max-sandboxes N] [--max-cpu CPU] [--max-memory BYTES] [--max-volume-bytes BYTES] [--max-snapshots N] [--max-snapshot-bytes BYTES]",
		Short: "Set an organization's limits; each value is a number, \"unlimited\", or \"default\" (the gateway's --default-max-*); a flag not given keeps its limit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if org == "" {
				return fmt.Errorf("--org is required")
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			cur, err := adm.Quotas.GetQuota(cmd.Context(), connect.NewRequest(&quotav1.GetQuotaRequest{OrgId: org}))
			if err != nil {
				return err
			}
			l := cur.Msg.GetLimits()
			if l == nil {
				l = &quotav1.QuotaLimits{}
			}
			for _, f := range []struct {
				flag, v string
				dst     **int64
				parse   func(string) (int64, error)
			}{
				{"max-sandboxes", sandboxes, &l.MaxSandboxes, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }},
				{"max-cpu", cpu, &l.MaxCpuMillicores, quantity.ParseCPU},
				{"max-memory", memory, &l.MaxMemoryBytes, quantity.ParseMemory},
				{"max-volume-bytes", volumeBytes, &l.MaxVolumeBytes, quantity.ParseMemory},
				{"max-snapshots", snapshots, &l.MaxSnapshots, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }},
				{"max-snapshot-bytes", snapshotBytes, &l.MaxSnapshotBytes, quantity.ParseMemory},
			} {
				if !cmd.Flags().Changed(f.flag) {
					continue
				}
				switch strings.ToLower(f.v) {
				case "default":
					*f.dst = nil
				case "unlimited", "-1":
					v := int64(-1)
					*f.dst = &v
				default:
					v, err := f.parse(f.v)
					if err != nil || v < 0 {
						return fmt.Errorf("--%s %q: a non-negative quantity, \"unlimited\" or \"default\"", f.flag, f.v)
					}
					*f.dst = &v
				}
			}
			out, err := adm.Quotas.SetQuota(cmd.Context(), connect.NewRequest(&quotav1.SetQuotaRequest{OrgId: org, Limits: l}))
			if err != nil {
				return err
			}
			return a.printQuota(out.Msg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&org, "org", "", "the organization")
	f.StringVar(&sandboxes, "max-sandboxes", "", "sandboxes that have not ended, at once")
	f.StringVar(&cpu, "max-cpu", "", "CPU of its live sandboxes in all (e.g. 16 or 16000m)")
	f.StringVar(&memory, "max-memory", "", "memory of its live sandboxes in all (e.g. 64Gi)")
	f.StringVar(&volumeBytes, "max-volume-bytes", "", "sizes of its registered volumes in all (e.g. 500Gi)")
	f.StringVar(&snapshots, "max-snapshots", "", "file-system snapshots it holds (default: the gateway's --fss-max-per-org)")
	f.StringVar(&snapshotBytes, "max-snapshot-bytes", "", "bytes of its file-system snapshots (e.g. 1Ti; default: the gateway's --fss-max-bytes-per-org)")
	return cmd
}

func (a *app) printQuota(q *quotav1.Quota) error {
	if a.json() {
		return a.printJSON(q)
	}
	set, eff := q.GetLimits(), q.GetEffective()
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintf(tw, "ORGANIZATION\t%s\n", q.GetOrgId())
	_, _ = fmt.Fprintln(tw, "QUOTA\tSET\tEFFECTIVE")
	row := func(name string, s, e *int64, format func(int64) string) {
		set := "default"
		if s != nil {
			set = limitText(s, format)
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\n", name, set, limitText(e, format))
	}
	row("sandboxes", set.MaxSandboxes, eff.MaxSandboxes, func(v int64) string { return strconv.FormatInt(v, 10) })
	row("cpu", set.MaxCpuMillicores, eff.MaxCpuMillicores, quantity.FormatCPU)
	row("memory", set.MaxMemoryBytes, eff.MaxMemoryBytes, quantity.FormatMemory)
	row("volume bytes", set.MaxVolumeBytes, eff.MaxVolumeBytes, quantity.FormatMemory)
	row("snapshots", set.MaxSnapshots, eff.MaxSnapshots, func(v int64) string { return strconv.FormatInt(v, 10) })
	row("snapshot bytes", set.MaxSnapshotBytes, eff.MaxSnapshotBytes, quantity.FormatMemory)
	if q.GetUpdateTime() != nil {
		_, _ = fmt.Fprintf(tw, "updated\t%s by %s\t\n", ts(q.GetUpdateTime()), q.GetUpdatedBy())
	}
	return tw.Flush()
}

// limitText is a limit for people: absent or -1 is unlimited.
func limitText(v *int64, format func(int64) string) string {
	if v == nil || *v < 0 {
		return "unlimited"
	}
	return format(*v)
}
