package sbxcli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
)

// maxSecretInput bounds what `sbx secret set` reads from stdin (the gateway's value limit
// is 64 KiB; one byte more tells an oversized value from a full one).
const maxSecretInput = 64<<10 + 1

func (a *app) secretCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "secret",
		Aliases: []string{"secrets"},
		Short:   "Manage your organization's secret stores and their secrets",
		Long: `A secret store holds secrets (path, field → value), encrypted at rest. Values are
write-only: no command or API call shows one. A sandbox takes a secret as an environment
variable (Container.secret_stores in the spec) or as the credentials of its image's pull
(image_pull_credentials); see docs/secrets.md. Writes need an admin API key.`,
	}
	store := &cobra.Command{Use: "store", Short: "Create, list and delete secret stores"}
	store.AddCommand(a.secretStoreCreateCommand(), a.secretStoreLsCommand(), a.secretStoreRmCommand())
	cmd.AddCommand(store, a.secretSetCommand(), a.secretLsCommand(), a.secretRmCommand())
	return cmd
}

func (a *app) secretStoreCreateCommand() *cobra.Command {
	var requestID, provider string
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a secret store (the built-in provider, or --provider kubernetes)",
		Long: `Create a secret store. --provider sandboxd (the default) is the built-in store:
values set with "sbx secret set", kept encrypted by sandboxd. --provider kubernetes takes
values from Kubernetes Secrets in the namespace of the Kubernetes runner a sandbox runs on:
a reference's path names the Secret and its field a key. A Secret is used only when it
carries the labels sandboxd.io/secret-store=NAME and sandboxd.io/secret-store-org=<the
first 48 hex digits of the SHA-256 of your organization ID> (docs/secrets.md).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pt, ok := map[string]sandboxv1.SecretStoreProviderType{
				"sandboxd":   sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_SANDBOXD,
				"kubernetes": sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_KUBERNETES,
			}[strings.ToLower(provider)]
			if !ok {
				return fmt.Errorf("--provider %q: must be sandboxd or kubernetes", provider)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			st, err := c.CreateSecretStoreOf(cmd.Context(), args[0], pt, requestID)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(st)
			}
			_, err = fmt.Fprintln(a.stdout, st.GetName())
			return err
		},
	}
	cmd.Flags().StringVar(&requestID, "request-id", "", "makes a retried create return the same store")
	cmd.Flags().StringVar(&provider, "provider", "sandboxd", "sandboxd (the built-in store) or kubernetes (Secrets in the Kubernetes runner's namespace)")
	return cmd
}

func (a *app) secretStoreLsCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your organization's secret stores",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sts, err := c.ListSecretStores(cmd.Context())
			if err != nil {
				return err
			}
			if a.json() {
				return printJSONList(a, sts, func(s *sandboxv1.SecretStore) protoMessage { return s })
			}
			w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(w, "NAME\tPROVIDER\tCREATED")
			for _, s := range sts {
				_, _ = fmt.Fprintf(w, "%s\t%s\t%s\n", s.GetName(), strings.TrimPrefix(s.GetProviderType().String(), "SECRET_STORE_PROVIDER_TYPE_"),
					s.GetCreateTime().AsTime().Format(time.RFC3339))
			}
			return w.Flush()
		},
	}
}

func (a *app) secretStoreRmCommand() *cobra.Command {
	var allowMissing bool
	cmd := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Delete a secret store and every secret in it",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.DeleteSecretStore(cmd.Context(), args[0], allowMissing)
		},
	}
	cmd.Flags().BoolVar(&allowMissing, "allow-missing", false, "succeed when there is no such store")
	return cmd
}

func (a *app) secretSetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "set STORE PATH [FIELD]",
		Short: "Set a secret's value, read from standard input",
		Long: `set reads the value from standard input (never from the command line, where it would
show in the process list and shell history); one trailing newline is dropped. FIELD
defaults to the path's default field ("").`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			b, err := io.ReadAll(io.LimitReader(a.stdin, maxSecretInput))
			if err != nil {
				return fmt.Errorf("read the value from stdin: %w", err)
			}
			v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
			field := ""
			if len(args) == 3 {
				field = args[2]
			}
			x, err := c.PutSecret(cmd.Context(), args[0], args[1], field, v)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(x)
			}
			return nil
		},
	}
}

func (a *app) secretLsCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "ls STORE",
		Aliases: []string{"list"},
		Short:   "List a store's secrets (paths and fields, never values)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			xs, err := c.ListSecrets(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json() {
				return printJSONList(a, xs, func(x *settingsv1.Secret) protoMessage { return x })
			}
			w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(w, "PATH\tFIELD\tUPDATED")
			for _, x := range xs {
				_, _ = fmt.Fprintf(w, "%s\t%s\t%s\n", x.GetPath(), x.GetField(), x.GetUpdateTime().AsTime().Format(time.RFC3339))
			}
			return w.Flush()
		},
	}
}

func (a *app) secretRmCommand() *cobra.Command {
	var allowMissing bool
	cmd := &cobra.Command{
		Use:     "rm STORE PATH [FIELD]",
		Aliases: []string{"delete"},
		Short:   "Delete a secret",
		Args:    cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			field := ""
			if len(args) == 3 {
				field = args[2]
			}
			return c.DeleteSecret(cmd.Context(), args[0], args[1], field, allowMissing)
		},
	}
	cmd.Flags().BoolVar(&allowMissing, "allow-missing", false, "succeed when there is no such secret")
	return cmd
}
