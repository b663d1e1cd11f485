package sbxcli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/controlplane"
)

// clusterCommand is `sbx admin cluster`: the Kubernetes clusters the control plane installs
// runners into (platform admins only).
func (a *app) clusterCommand() *cobra.Command {
	c := &cobra.Command{Use: "cluster", Short: "Manage the clusters the control plane installs runners into (platform admins)"}
	c.AddCommand(a.clusterAddCommand(), a.clusterListCommand(), a.clusterGetCommand(), a.clusterRemoveCommand())
	return c
}

// readBounded reads a credential file of at most limit bytes.
func readBounded(flag, path string, limit int) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	if len(b) > limit {
		return "", fmt.Errorf("--%s: %s is larger than %d bytes", flag, path, limit)
	}
	return string(b), nil
}

func (a *app) clusterAddCommand() *cobra.Command {
	var c controlplanev1.Cluster
	var kubeconfig, tokenFile, caFile string
	cmd := &cobra.Command{
		Use:   "add CLUSTER_ID (--kubeconfig FILE | --server URL --token-file FILE --ca-file FILE) [--org ORG]",
		Short: "Register a cluster; runners created with its cluster_id are installed into it",
		Long: "Register a Kubernetes cluster with the control plane. The credential is stored encrypted and never shown again.\n" +
			"A runner created (in the cluster's organization) with this cluster_id is installed by the control plane.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c.ClusterId = args[0]
			var err error
			switch {
			case kubeconfig != "" && (tokenFile != "" || caFile != ""):
				return fmt.Errorf("give --kubeconfig, or --server with --token-file and --ca-file, not both")
			case kubeconfig != "":
				if c.Kubeconfig, err = readBounded("kubeconfig", kubeconfig, controlplane.MaxKubeconfig); err != nil {
					return err
				}
			case tokenFile != "":
				tok, err := readBounded("token-file", tokenFile, controlplane.MaxToken+2)
				if err != nil {
					return err
				}
				c.Token = trimNewline(tok)
				if caFile != "" {
					if c.CaPem, err = readBounded("ca-file", caFile, controlplane.MaxCAPEM); err != nil {
						return err
					}
				}
			default:
				return fmt.Errorf("a credential is required: --kubeconfig FILE, or --server URL --token-file FILE --ca-file FILE")
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Clusters.AddCluster(cmd.Context(), connect.NewRequest(&controlplanev1.AddClusterRequest{Cluster: &c}))
			if err != nil {
				return err
			}
			return a.printCluster(out.Msg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig whose current context reaches the cluster (inline credentials only)")
	f.StringVar(&c.Server, "server", "", "API server URL (https://…), with --token-file")
	f.StringVar(&tokenFile, "token-file", "", "file holding a service-account bearer token")
	f.StringVar(&caFile, "ca-file", "", "PEM file of the API server's CA, with --token-file")
	f.StringVar(&c.OrganizationId, "org", "", "organization whose runners are installed on it (default: the platform organization)")
	return cmd
}

// trimNewline drops the line ending a token file usually has.
func trimNewline(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	return s
}

func (a *app) clusterListCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List registered clusters (never their credentials)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Clusters.ListClusters(cmd.Context(), connect.NewRequest(&controlplanev1.ListClustersRequest{}))
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(out.Msg)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "CLUSTER\tSERVER\tCREDENTIAL\tORGANIZATION\tCREATED")
			for _, c := range out.Msg.GetClusters() {
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.GetClusterId(), c.GetServer(), credentialKind(c),
					c.GetOrganizationId(), ts(c.GetCreateTime()))
			}
			return tw.Flush()
		},
	}
}

func (a *app) clusterGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get CLUSTER_ID",
		Short: "Show a registered cluster (never its credential)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			out, err := adm.Clusters.GetCluster(cmd.Context(), connect.NewRequest(&controlplanev1.GetClusterRequest{ClusterId: args[0]}))
			if err != nil {
				return err
			}
			return a.printCluster(out.Msg)
		},
	}
}

func (a *app) clusterRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "rm CLUSTER_ID",
		Aliases: []string{"delete"},
		Short:   "Forget a cluster (refused while a runner names it: delete the runner first, which uninstalls it)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			adm, err := a.admin()
			if err != nil {
				return err
			}
			if _, err := adm.Clusters.DeleteCluster(cmd.Context(), connect.NewRequest(&controlplanev1.DeleteClusterRequest{ClusterId: args[0]})); err != nil {
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "cluster %s removed\n", args[0])
			return err
		},
	}
}

func (a *app) printCluster(c *controlplanev1.Cluster) error {
	if a.json() {
		return a.printJSON(c)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintf(tw, "Cluster:\t%s\n", c.GetClusterId())
	_, _ = fmt.Fprintf(tw, "Server:\t%s\n", c.GetServer())
	_, _ = fmt.Fprintf(tw, "Credential:\t%s (stored encrypted, never shown)\n", credentialKind(c))
	_, _ = fmt.Fprintf(tw, "Organization:\t%s\n", c.GetOrganizationId())
	_, _ = fmt.Fprintf(tw, "Created:\t%s\n", ts(c.GetCreateTime()))
	return tw.Flush()
}

// credentialKind is the cluster's credential kind without the enum's prefix.
func credentialKind(c *controlplanev1.Cluster) string {
	return strings.TrimPrefix(c.GetCredentialKind().String(), "CLUSTER_CREDENTIAL_KIND_")
}
