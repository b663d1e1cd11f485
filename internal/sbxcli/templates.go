package sbxcli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// maxSpecFileBytes bounds a template spec file (its files' contents included).
const maxSpecFileBytes = 16 << 20

// yamlOutput marks a command that also takes -o yaml.
const yamlOutput = "sbx-output-yaml"

func (a *app) templateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "template",
		Aliases: []string{"templates"},
		Short:   "Manage your organization's sandbox templates",
		Long: `A sandbox template is a partial sandbox spec (PartialSandboxSpec) kept by your
organization under a unique name; sbx run --template NAME starts a sandbox from it,
with the run flags you give as overrides. Commands take a template's ID or its name.
Creating, updating and deleting templates needs the SANDBOX_ADMIN role.

A spec file is YAML or JSON with PartialSandboxSpec's protojson field names (snake_case
or camelCase; unknown fields are errors), e.g.:

  containers:
    - name: main
      image: python:3.11
      command: /bin/sh
      args: ["-c", "sleep infinity"]
      environment_variables: {PYTHONUNBUFFERED: "1"}
  max_lifetime_seconds: 3600
  tags: [py]`,
	}
	cmd.AddCommand(a.templateCreateCommand(), a.templateLsCommand(), a.templateGetCommand(), a.templateUpdateCommand(), a.templateRmCommand(),
		a.templateBuildCommand())
	return cmd
}

// readSpecFile reads a template spec file ("-" = stdin), at most maxSpecFileBytes.
func (a *app) readSpecFile(path string) ([]byte, error) {
	var r io.Reader
	if path == "-" {
		if a.stdin == nil {
			return nil, errors.New("-f -: nothing on stdin")
		}
		r = a.stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxSpecFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxSpecFileBytes {
		return nil, fmt.Errorf("spec %s is larger than %d MiB", path, maxSpecFileBytes>>20)
	}
	return b, nil
}

// parseTemplateSpec parses a PartialSandboxSpec from YAML or JSON (JSON is YAML):
// strict (unknown fields and duplicate keys are errors). fields are the top-level fields
// the document names, as proto names, sorted: what an update replaces.
func parseTemplateSpec(name string, b []byte) (*sandboxv1.PartialSandboxSpec, []string, error) {
	j, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		return nil, nil, fmt.Errorf("spec %s: %w", name, err)
	}
	j = bytes.TrimSpace(j)
	if len(j) == 0 || j[0] != '{' {
		return nil, nil, fmt.Errorf("spec %s: the document must be a mapping of PartialSandboxSpec fields (containers, max_lifetime_seconds, tags, …)", name)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(j, &top); err != nil {
		return nil, nil, fmt.Errorf("spec %s: %w", name, err)
	}
	var fields []string
	for k := range top {
		f, ok := sandbox.SpecFieldName(k)
		if !ok {
			return nil, nil, fmt.Errorf("spec %s: unknown field %q (PartialSandboxSpec's fields are containers, volumes, services, max_lifetime_seconds, tags, runner_ids, network, annotations, mode, runtime_class, …)", name, k)
		}
		if slices.Contains(fields, f) {
			return nil, nil, fmt.Errorf("spec %s: field %q is given twice (as %s and its other name)", name, f, k)
		}
		fields = append(fields, f)
	}
	slices.Sort(fields)
	var spec sandboxv1.PartialSandboxSpec
	if err := protojson.Unmarshal(j, &spec); err != nil {
		return nil, nil, fmt.Errorf("spec %s: %w", name, err)
	}
	return &spec, fields, nil
}

func (a *app) templateCreateCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "create NAME -f SPEC",
		Short: "Create a template from a spec file (YAML or JSON; -f - reads stdin) and print its ID",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := a.readSpecFile(file)
			if err != nil {
				return err
			}
			spec, _, err := parseTemplateSpec(file, b)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := c.CreateTemplate(cmd.Context(), args[0], spec)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(t.Proto())
			}
			_, err = fmt.Fprintln(a.stdout, t.ID)
			return err
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the spec file, YAML or JSON (- = stdin)")
	_ = cmd.MarkFlagRequired("file")
	return cmd
}

// isTemplateID: s has the shape of a template ID (a UUID; a name never has it).
func isTemplateID(s string) bool {
	_, err := uuid.Parse(s)
	return err == nil && len(s) == 36
}

// templateImage is the image of a template's primary container ("-" for none).
func templateImage(t *sandbox.Template) string {
	cs := t.Spec.GetContainers()
	for _, c := range cs {
		if c.GetPrimary() {
			return dash(c.GetImage())
		}
	}
	if len(cs) > 0 {
		return dash(cs[0].GetImage())
	}
	return "-"
}

func (a *app) templateLsCommand() *cobra.Command {
	var opts sandbox.TemplateListOptions
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your organization's templates",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.ListTemplates(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if a.json() {
				return printJSONList(a, list, func(t *sandbox.Template) protoMessage { return t.Proto() })
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			head := "ID\tNAME\tREVISION\tIMAGE\tUPDATED"
			if opts.ShowDeleted {
				head += "\tDELETED"
			}
			_, _ = fmt.Fprintln(tw, head)
			for _, t := range list {
				updated := t.UpdatedAt
				if updated.IsZero() {
					updated = t.CreatedAt
				}
				line := fmt.Sprintf("%s\t%s\t%d\t%s\t%s", t.ID, t.DisplayName, t.Revision, templateImage(t), ago(updated))
				if opts.ShowDeleted {
					line += "\t" + yesNo(t.Deleted)
				}
				_, _ = fmt.Fprintln(tw, line)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&opts.ShowDeleted, "deleted", false, "deleted templates too")
	return cmd
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return age(t) + " ago"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// specYAML renders a template spec as YAML with proto field names (what a spec file
// takes back).
func specYAML(spec *sandboxv1.PartialSandboxSpec) (string, error) {
	if spec == nil {
		spec = &sandboxv1.PartialSandboxSpec{}
	}
	j, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(spec)
	if err != nil {
		return "", err
	}
	y, err := yaml.JSONToYAML(j)
	return string(y), err
}

func (a *app) templateGetCommand() *cobra.Command {
	var deleted bool
	cmd := &cobra.Command{
		Use:         "get NAME|ID",
		Aliases:     []string{"describe"},
		Short:       "Show a template and its spec (-o json or -o yaml: the template as the API returns it)",
		Args:        cobra.ExactArgs(1),
		Annotations: map[string]string{yamlOutput: "true"},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := c.GetTemplate(cmd.Context(), args[0], deleted)
			if deleted && !isTemplateID(args[0]) && errors.Is(err, sandbox.ErrTemplateNotFound) {
				return fmt.Errorf("%w; a deleted template is found by its ID only (sbx template ls --deleted)", err)
			}
			if err != nil {
				return err
			}
			switch a.output {
			case "json":
				return a.printJSON(t.Proto())
			case "yaml":
				j, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(t.Proto())
				if err != nil {
					return err
				}
				y, err := yaml.JSONToYAML(j)
				if err != nil {
					return err
				}
				_, err = a.stdout.Write(y)
				return err
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			row := func(k, v string) {
				if v != "" {
					_, _ = fmt.Fprintf(tw, "%s:\t%s\n", k, v)
				}
			}
			now := time.Now()
			row("ID", t.ID)
			row("Name", t.DisplayName)
			row("Revision", strconv.FormatInt(t.Revision, 10))
			row("Image", templateImage(t))
			row("Created", humanTime(t.CreatedAt, now))
			row("Created by", t.CreatedBy)
			row("Updated", humanTime(t.UpdatedAt, now))
			if t.Deleted {
				row("Deleted", dash(humanTime(t.DeletedAt, now)))
			}
			if t.RequiresCKS {
				row("Requires CKS", "yes")
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			y, err := specYAML(t.Spec)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "Spec:\n%s", indent(y, "  "))
			return err
		},
	}
	cmd.Flags().BoolVar(&deleted, "deleted", false, "show the template also if it is deleted (by ID: a name names a template not deleted)")
	return cmd
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if l != "" && l != "\n" {
			b.WriteString(prefix)
		}
		b.WriteString(l)
	}
	return b.String()
}

func (a *app) templateUpdateCommand() *cobra.Command {
	var (
		file, name string
		replace    bool
		revision   int64
	)
	cmd := &cobra.Command{
		Use:   "update NAME|ID [-f SPEC [--replace]] [--name NEW] [--revision N]",
		Short: "Change a template's spec or name; prints its new revision",
		Long: `update changes what you give: with -f, the top-level spec fields the file names
replace the template's (a field given empty, e.g. tags: [], clears it; fields the file
does not name are kept); with --replace the file is the whole new spec. --name renames
the template. With --revision N the update applies only if the template is still at
revision N (else it fails with CWSANDBOX_ETAG_MISMATCH: read it again). Sandboxes
already made from the template are not affected.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			u := sandbox.TemplateUpdate{DisplayName: name, Revision: revision}
			if cmd.Flags().Changed("name") && name == "" {
				return errors.New("--name: a template's name cannot be empty")
			}
			if replace && file == "" {
				return errors.New("--replace needs -f SPEC")
			}
			if file != "" {
				b, err := a.readSpecFile(file)
				if err != nil {
					return err
				}
				spec, fields, err := parseTemplateSpec(file, b)
				if err != nil {
					return err
				}
				if !replace && len(fields) == 0 {
					return fmt.Errorf("spec %s names no field: nothing to change (use --replace to make the spec empty)", file)
				}
				u.Spec = spec
				if !replace {
					u.SpecFields = fields
				}
			}
			if u.Spec == nil && u.DisplayName == "" {
				return errors.New("nothing to change: give -f SPEC and/or --name NEW")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			t, err := c.UpdateTemplate(cmd.Context(), args[0], u)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(t.Proto())
			}
			_, err = fmt.Fprintf(a.stdout, "%s %s revision %d\n", t.ID, t.DisplayName, t.Revision)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "spec file, YAML or JSON (- = stdin): the fields it names replace the template's")
	f.BoolVar(&replace, "replace", false, "the -f file replaces the whole spec")
	f.StringVar(&name, "name", "", "rename the template")
	f.Int64Var(&revision, "revision", 0, "apply only if the template is at this revision")
	return cmd
}

func (a *app) templateRmCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME|ID...",
		Aliases: []string{"delete"},
		Short:   "Delete templates (sandboxes made from them are not affected)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteTemplate(cmd.Context(), id); err != nil {
					return fmt.Errorf("delete %s: %w", id, err)
				}
			}
			return nil
		},
	}
}
