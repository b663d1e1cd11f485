package sbxcli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// buildArgName is a Dockerfile ARG name (as the API checks it).
var buildArgName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// parseBuildArgs parses --build-arg K=V (a bare K takes $K from the environment).
func parseBuildArgs(args []string) (map[string]string, error) {
	if len(args) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range args {
		k, v, ok := strings.Cut(kv, "=")
		if !buildArgName.MatchString(k) {
			return nil, fmt.Errorf("--build-arg %q: the name must match [A-Za-z_][A-Za-z0-9_]*", kv)
		}
		if !ok {
			if v, ok = os.LookupEnv(k); !ok {
				return nil, fmt.Errorf("--build-arg %s: no value given and $%s is not set", k, k)
			}
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("--build-arg %s is given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// dockerfileInContext turns -f (relative to the working directory, as docker build
// takes it; "" = DIR/Dockerfile) into the Dockerfile's path inside the context dir.
func dockerfileInContext(file, dir string) (string, error) {
	if file == "" {
		return "Dockerfile", nil
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	absFile, err := filepath.Abs(file)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(absDir, absFile)
	if err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("-f %s: the Dockerfile must be inside the context directory %s (the builder sees only the context)", file, dir)
	}
	return filepath.ToSlash(rel), nil
}

func (a *app) templateBuildCommand() *cobra.Command {
	var (
		file, name, builderSize string
		buildArgs               []string
		opts                    sandbox.BuildOptions
		detach                  bool
	)
	cmd := &cobra.Command{
		Use:   "build [-f DOCKERFILE] DIR --name NAME",
		Short: "Build an image from a Dockerfile and the directory DIR, and make it template NAME's image",
		Long: `Build packs DIR (the build context; a .dockerignore at its top excludes files the
way docker build does, symlinks are sent as symlinks), builds the Dockerfile inside a
builder sandbox and makes the image the template's: a new template NAME, or the
container image of the existing one (a template update). It shows each step and its
output, and exits non-zero naming the failing step. Ctrl-C cancels the build, unless
--detach, which prints the build's ID and returns (follow it with sbx build logs -f ID).
-f is relative to the working directory and must be inside DIR (default DIR/Dockerfile).
Needs the SANDBOX_ADMIN role. With -o json, progress goes to stderr and the ended build
to stdout.`,
		Example: `  sbx template build -f Dockerfile . --name py-tools
  sbx template build ./ctx --name py-tools --build-arg PY=3.11 --timeout 20m
  sbx template build . --name py-tools --detach`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			fi, err := os.Stat(dir)
			if err != nil {
				return fmt.Errorf("the context directory: %w", err)
			}
			if !fi.IsDir() {
				return fmt.Errorf("the context %s is not a directory", dir)
			}
			df, err := dockerfileInContext(file, dir)
			if err != nil {
				return err
			}
			if opts.BuildArgs, err = parseBuildArgs(buildArgs); err != nil {
				return err
			}
			if opts.Timeout < 0 {
				return errors.New("--timeout must not be negative")
			}
			opts.Dockerfile, opts.BuilderSize = df, builderSize
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			// Progress goes where it does not mix with JSON.
			progress := a.stdout
			if a.json() {
				progress = a.stderr
			}
			packed := func(pc *sandbox.BuildContext) {
				_, _ = fmt.Fprintf(progress, "Sending build context: %d entries, %s (%s compressed)\n",
					pc.Entries, humanBytes(pc.Bytes), humanBytes(int64(len(pc.Archive))))
			}
			if detach {
				pc, err := sandbox.PackBuildContext(ctx, dir, sandbox.PackOptions{Dockerfile: df})
				if err != nil {
					return err
				}
				packed(pc)
				b, err := c.StartBuild(ctx, sandbox.BuildTarget{Template: name}, pc.Archive, opts)
				if err != nil {
					return err
				}
				if a.json() {
					return a.printJSON(b.Proto())
				}
				_, err = fmt.Fprintln(a.stdout, b.ID)
				return err
			}
			pr := &buildProgress{w: progress}
			b, err := c.BuildTemplate(ctx, name, dir, sandbox.BuildTemplateOptions{
				BuildOptions: opts,
				OnPacked:     packed,
				OnStart: func(b *sandbox.Build) {
					_, _ = fmt.Fprintf(progress, "Build %s queued (template %s)\n", b.ID, name)
				},
				OnEvent: pr.event,
			})
			if ctx.Err() != nil && b != nil {
				_, _ = fmt.Fprintf(a.stderr, "sbx: build %s %s\n", b.ID, cancelledState(b))
			}
			return a.buildResult(b, err, progress)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "the Dockerfile (relative to the working directory, inside DIR; default DIR/Dockerfile)")
	f.StringVar(&name, "name", "", "the template's name (created if the organization has none)")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "a build argument NAME=VALUE (NAME alone: from the environment); repeatable")
	f.StringVar(&opts.TargetStage, "target", "", "the build stage to stop at (default the last)")
	f.BoolVar(&opts.NoCache, "no-cache", false, "build without the organization's layer cache")
	f.DurationVar(&opts.Timeout, "timeout", 0, "the build's time limit, e.g. 20m (default the policy's)")
	f.StringVar(&builderSize, "builder-size", "", "the builder's size: small, medium or large (default the policy's)")
	f.BoolVarP(&detach, "detach", "d", false, "print the build's ID and return at once (the build goes on)")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

// cancelledState says what became of a build sbx stopped following.
func cancelledState(b *sandbox.Build) string {
	if b.State == sandbox.BuildCancelled {
		return "cancelled"
	}
	return "is " + b.State.String()
}

// buildResult prints the ended build b (err: how it ended) and returns err.
func (a *app) buildResult(b *sandbox.Build, err error, progress io.Writer) error {
	var be *sandbox.BuildError
	if b == nil || (err != nil && !errors.As(err, &be)) {
		return err
	}
	if a.json() {
		if perr := a.printJSON(b.Proto()); perr != nil {
			return perr
		}
		return err
	}
	if b.State == sandbox.BuildSucceeded {
		cached := 0
		for _, st := range b.Steps {
			if st.Cached {
				cached++
			}
		}
		msg := fmt.Sprintf("Build %s succeeded in %s (%d of %d steps from the layer cache): %s", b.ID, buildDuration(b), cached, len(b.Steps), b.Image)
		if b.TemplateID != "" {
			msg += fmt.Sprintf(" (template %s revision %d)", dash(b.Template), b.TemplateRevision)
		}
		_, _ = fmt.Fprintln(progress, msg)
	}
	return err
}

func buildDuration(b *sandbox.Build) string {
	if b.StartedAt.IsZero() || b.EndedAt.IsZero() {
		return "-"
	}
	return humanDuration(b.EndedAt.Sub(b.StartedAt))
}

// buildProgress prints build log events: a line per step ("Step 3/7: RUN … (cached)")
// and the output lines as they are, but for the builder's own header of the step just
// printed ("STEP 3/7: RUN …", which gives the total when the build did not yet).
type buildProgress struct {
	w     io.Writer
	total int32
	step  *sandbox.BuildStep // the last step printed
}

func (p *buildProgress) event(e sandbox.BuildEvent) error {
	switch {
	case e.Build != nil:
		if e.Build.TotalSteps > 0 {
			p.total = e.Build.TotalSteps
		}
	case e.Step != nil:
		p.step = e.Step
		n := strconv.Itoa(int(e.Step.Number))
		if p.total > 0 {
			n += "/" + strconv.Itoa(int(p.total))
		}
		line := "Step " + n + ": " + e.Step.Instruction
		if e.Step.Cached {
			line += " (cached)"
		}
		_, err := fmt.Fprintln(p.w, line)
		return err
	case e.Line != nil:
		if p.step != nil {
			var n, total int32
			if k, _ := fmt.Sscanf(e.Line.Text, "STEP %d/%d:", &n, &total); k == 2 && n == p.step.Number &&
				strings.HasSuffix(e.Line.Text, ": "+p.step.Instruction) {
				p.step = nil
				if p.total == 0 {
					p.total = total
				}
				return nil
			}
		}
		_, err := fmt.Fprintln(p.w, e.Line.Text)
		return err
	}
	return nil
}

func (a *app) buildCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "build",
		Aliases: []string{"builds"},
		Short:   "List, inspect, follow and cancel image builds (sbx template build starts them)",
	}
	cmd.AddCommand(a.buildLsCommand(), a.buildGetCommand(), a.buildLogsCommand(), a.buildCancelCommand())
	return cmd
}

// buildTarget renders a build's target: "template NAME" or "repository NAME:TAG".
func buildTarget(b *sandbox.Build) string {
	switch {
	case b.Template != "":
		return "template " + b.Template
	case b.Repository != "":
		return "repository " + b.Repository
	}
	return "-"
}

func buildSteps(b *sandbox.Build) string {
	if b.TotalSteps > 0 {
		return fmt.Sprintf("%d/%d", len(b.Steps), b.TotalSteps)
	}
	return strconv.Itoa(len(b.Steps))
}

func (a *app) buildLsCommand() *cobra.Command {
	var opts sandbox.BuildListOptions
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your organization's builds, newest first",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.ListBuilds(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if a.json() {
				return printJSONList(a, list, func(b *sandbox.Build) protoMessage { return b.Proto() })
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "ID\tSTATE\tTARGET\tSTEPS\tDURATION\tAGE")
			for _, b := range list {
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", b.ID, b.State, buildTarget(b), buildSteps(b), buildDuration(b), age(b.CreatedAt))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&opts.Template, "template", "", "only the builds of this template (its name)")
	return cmd
}

func (a *app) buildGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "get ID",
		Aliases: []string{"describe"},
		Short:   "Show a build: its state, steps, image or failing step",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			b, err := c.GetBuild(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(b.Proto())
			}
			return a.printBuild(b)
		},
	}
}

func (a *app) printBuild(b *sandbox.Build) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			_, _ = fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	now := time.Now()
	row("ID", b.ID)
	row("State", b.State.String())
	row("Target", buildTarget(b))
	if b.TemplateID != "" {
		row("Template", fmt.Sprintf("%s (revision %d)", b.TemplateID, b.TemplateRevision))
	}
	row("Image", b.Image)
	row("Dockerfile", b.Dockerfile)
	row("Builder size", b.BuilderSize)
	row("Runner", b.RunnerID)
	row("Created", humanTime(b.CreatedAt, now))
	row("Started", humanTime(b.StartedAt, now))
	row("Ended", humanTime(b.EndedAt, now))
	if d := buildDuration(b); d != "-" {
		row("Duration", d)
	}
	if s := b.FailedStep; s != nil {
		row("Failed step", fmt.Sprintf("%d: %s", s.Number, s.Instruction))
	}
	row("Failure", strings.TrimPrefix(b.FailureReason+": "+b.FailureMessage, ": "))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(b.Steps) == 0 {
		return nil
	}
	_, _ = fmt.Fprintln(a.stdout, "Steps:")
	pr := &buildProgress{w: a.stdout, total: b.TotalSteps}
	for _, s := range b.Steps {
		if err := pr.event(sandbox.BuildEvent{Step: &s}); err != nil {
			return err
		}
	}
	return nil
}

func (a *app) buildLogsCommand() *cobra.Command {
	var (
		follow bool
		after  int64
	)
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a build's log: steps and output (-f: follow until it ends; -o json: one event per line)",
		Long: `Logs prints the build's log kept so far: a line per step and the build's output. With
-f it follows the live log until the build ends and exits non-zero if it failed
(Ctrl-C stops following; the build goes on). With -o json each event is a JSON line
(sandboxd.build.v1.BuildLogEvent).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			pr := &buildProgress{w: a.stdout}
			fn := pr.event
			if a.json() {
				fn = func(e sandbox.BuildEvent) error { return a.printEventJSON(e) }
			}
			if !follow {
				_, err := c.BuildLogs(cmd.Context(), args[0], sandbox.BuildLogOptions{AfterSeq: after}, fn)
				return err
			}
			b, err := c.FollowBuild(cmd.Context(), args[0], after, fn)
			if a.json() || cmd.Context().Err() != nil {
				return err
			}
			return a.buildResult(b, err, a.stdout)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the log until the build ends")
	cmd.Flags().Int64Var(&after, "after", 0, "start after this event number (resume)")
	return cmd
}

// printEventJSON writes one log event as a JSON line.
func (a *app) printEventJSON(e sandbox.BuildEvent) error {
	b, err := protojson.Marshal(e.Proto())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

func (a *app) buildCancelCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a queued or running build (one that ended is shown as it is)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			b, err := c.CancelBuild(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(b.Proto())
			}
			_, err = fmt.Fprintf(a.stdout, "%s %s\n", b.ID, b.State)
			return err
		},
	}
}
