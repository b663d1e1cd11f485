package sbxcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

type protoMessage = proto.Message

func (a *app) runCommand() *cobra.Command {
	var (
		rm, interactive bool
		spec            sandbox.Spec
		env             []string
		lifetime        time.Duration
		mainCmd         string
		restores        []string
		template        string
	)
	cmd := &cobra.Command{
		Use:   "run IMAGE [-- CMD...] | run --container name=N,image=I[,…]… [-- CMD...] | run --template NAME [IMAGE] [-- CMD...]",
		Short: "Create a sandbox, wait for it, and run CMD in it",
		Long: `run creates a sandbox from IMAGE and waits until it runs. With CMD it runs the command
in the sandbox, streaming its output, and exits with its exit code (127 when it is not
found, 130 on Ctrl-C); --rm deletes the sandbox afterwards, also on Ctrl-C. Without --rm
the sandbox keeps running until its lifetime ends (stderr says until when and how to stop
it), and without CMD its ID goes to stdout.

With --container (repeatable) the sandbox is a group of containers sharing its network
(they reach each other on localhost) and lifetime; IMAGE and the single-container flags
(--env, --cpu, --memory, --workdir, --main) then go in each --container instead. The
primary container (marked primary, else the first) decides the sandbox's outcome and
runs CMD; a container without command= runs its image's entrypoint.

  sbx run --container name=app,image=busybox,command=sleep,arg=infinity \
          --container name=web,image=python:3.11,command=python3,arg=-m,arg=http.server,arg=8080 \
          -- sh -c 'until wget -qO- http://localhost:8080/; do sleep 1; done'

With --template NAME (a template's name or ID, see sbx template) the sandbox starts from
the template and only the flags you give change it: IMAGE (optional; CMD then follows
--), --main, --env (added to the template's variables), --workdir, --cpu and --memory
change a copy of the template's primary container (its other containers are kept);
--tag, --runner, --lifetime, --publish and --egress/--deny-egress replace the template's.

  sbx run --template py -e DEBUG=1 -- python3 -c 'print(42)'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if template != "" {
				_, _, err := templateArgs(cmd, args)
				return err
			}
			if len(spec.Containers) == 0 {
				return cobra.MinimumNArgs(1)(cmd, args)
			}
			if len(args) > 0 && cmd.ArgsLenAtDash() != 0 {
				return fmt.Errorf("with --container there is no IMAGE argument (give image= in each --container), got %q", args[0])
			}
			for _, name := range []string{"env", "cpu", "memory", "workdir", "main"} {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s sets the only container of a single-container sandbox: with --container give it in each (%s)", name, containerKey(name))
				}
			}
			return checkContainers(spec.Containers)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if template != "" {
				return a.runTemplate(cmd, template, args, spec, env, lifetime, mainCmd, rm, interactive)
			}
			argv, image := args, primaryImage(spec.Containers)
			if len(spec.Containers) == 0 {
				argv, image = args[1:], args[0]
			}
			if rm && len(argv) == 0 {
				return errors.New("--rm needs a command to run (sbx run IMAGE --rm -- CMD...)")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if len(spec.Containers) == 0 {
				spec.Image = args[0]
			}
			spec.Lifetime = lifetime
			if mainCmd != "" {
				spec.Command, spec.Args = "/bin/sh", []string{"-c", mainCmd}
			}
			if spec.Env, err = parseEnv(env); err != nil {
				return err
			}
			if err := applyRestores(&spec, restores); err != nil {
				return err
			}
			sb, err := c.Create(ctx, spec)
			if err != nil {
				return err
			}
			if rm {
				defer func() {
					dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
					defer cancel()
					if err := sb.Stop(dctx, 0); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
						_, _ = fmt.Fprintln(a.stderr, FormatError(fmt.Errorf("delete %s: %w", sb.ID(), err)))
					}
				}()
			} else {
				defer a.keepsRunning(sb)
			}
			if err := a.waitWithProgress(ctx, sb, image); err != nil {
				return err
			}
			return a.afterCreate(ctx, sb, argv, len(spec.Publish) > 0, interactive)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&rm, "rm", false, "delete the sandbox when the command ends")
	f.BoolVarP(&a.quiet, "quiet", "q", false, "show no start progress on stderr (image pulls, what the start waits for)")
	f.BoolVarP(&interactive, "interactive", "i", false, "forward stdin to the command")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringArrayVar(&spec.Tags, "tag", nil, "tag (repeatable)")
	f.StringVar(&spec.CPU, "cpu", "", `CPU, e.g. "500m" or "2"`)
	f.StringVar(&spec.Memory, "memory", "", `memory, e.g. "512Mi"`)
	f.StringVarP(&spec.WorkingDir, "workdir", "w", "", "working directory of the main command")
	f.DurationVar(&lifetime, "lifetime", 0, "maximum lifetime (default: the platform's)")
	f.StringArrayVar(&spec.RunnerIDs, "runner", nil, "place on this runner (repeatable)")
	f.StringVar(&mainCmd, "main", "", `the sandbox's main command, run by /bin/sh -c (default: one that waits until the sandbox is stopped), e.g. "python3 -m http.server 8080"`)
	f.Var(publishFlag{&spec.Publish}, "publish", "publish PORT on the runner's edge: PORT:https, PORT:https:token (callers need the sandbox's share token, printed once, or an API key of the organization) or PORT:tls (passthrough); repeatable")
	f.Var(egressFlag{&spec.Egress}, "egress", "allow egress to: any, cidr=PREFIX, dns=NAME (HTTPS to NAME or *.DOMAIN) or tenant=same_org|same_user; repeatable (default: the policy's or the platform's, any + tenant=same_org)")
	f.BoolVar(&spec.DenyEgress, "deny-egress", false, "allow no egress at all (the platform DNS still answers)")
	f.Var(containerFlag{&spec.Containers}, "container", containerHelp)
	f.Var(volumeFlag{&spec.Volumes}, "volume", "a scratch volume NAME mounted at PATH (in the primary container), of at most SIZE (e.g. 1Gi; default: the platform's); repeatable. It can be snapshotted (sbx snapshot create)")
	f.StringArrayVar(&restores, "restore", nil, "VOLUME=SNAPSHOT: start the --volume VOLUME with the snapshot's content (repeatable)")
	f.StringVar(&template, "template", "", "start from this template (name or ID); the flags given override its values")
	cmd.MarkFlagsMutuallyExclusive("egress", "deny-egress")
	for _, other := range []string{"container", "volume", "restore"} {
		cmd.MarkFlagsMutuallyExclusive("template", other)
	}
	return cmd
}

// afterCreate is the end of run once the sandbox runs: without argv print its ID (and
// endpoints), else run argv in it.
func (a *app) afterCreate(ctx context.Context, sb *sandbox.Sandbox, argv []string, published, interactive bool) error {
	if len(argv) == 0 {
		if a.json() {
			a.printShareToken(sb)
			return a.printJSON(sb.Proto())
		}
		if _, err := fmt.Fprintln(a.stdout, sb.ID()); err != nil {
			return err
		}
		a.printEndpoints(a.stderr, sb.Info())
		a.printShareToken(sb)
		return nil
	}
	if published {
		a.printEndpoints(a.stderr, sb.Info())
		a.printShareToken(sb)
	}
	opts := sandbox.ExecOptions{Stdout: a.stdout, Stderr: a.stderr}
	if interactive {
		opts.Stdin = a.stdin
	}
	return a.execResult(sb.Exec(ctx, argv, opts))
}

// templateArgs splits run --template's arguments into the optional IMAGE override and
// CMD, which must follow --.
func templateArgs(cmd *cobra.Command, args []string) (image string, argv []string, err error) {
	switch dash := cmd.ArgsLenAtDash(); {
	case dash == -1 && len(args) > 1:
		return "", nil, errors.New("with --template, CMD follows -- (sbx run --template NAME [IMAGE] -- CMD...)")
	case dash == -1 && len(args) == 1:
		return args[0], nil, nil
	case dash > 1:
		return "", nil, fmt.Errorf("with --template, at most one argument (IMAGE) comes before --, got %q", args[:dash])
	case dash == 1:
		return args[0], args[1:], nil
	}
	return "", args, nil
}

// runTemplate is run --template: the flags given become the overrides.
func (a *app) runTemplate(cmd *cobra.Command, template string, args []string, spec sandbox.Spec, env []string, lifetime time.Duration, mainCmd string, rm, interactive bool) error {
	ctx := cmd.Context()
	image, argv, err := templateArgs(cmd, args)
	if err != nil {
		return err
	}
	if rm && len(argv) == 0 {
		return errors.New("--rm needs a command to run (sbx run --template NAME --rm -- CMD...)")
	}
	o := sandbox.Overrides{Image: image, WorkingDir: spec.WorkingDir, CPU: spec.CPU, Memory: spec.Memory, Lifetime: lifetime,
		Tags: spec.Tags, RunnerIDs: spec.RunnerIDs, Publish: spec.Publish, Egress: spec.Egress, DenyEgress: spec.DenyEgress}
	if mainCmd != "" {
		o.Command, o.Args = "/bin/sh", []string{"-c", mainCmd}
	}
	if o.Env, err = parseEnv(env); err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	sb, err := c.RunTemplate(ctx, template, o, sandbox.FromTemplateOptions{})
	if err != nil {
		return err
	}
	if rm {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := sb.Stop(dctx, 0); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
				_, _ = fmt.Fprintln(a.stderr, FormatError(fmt.Errorf("delete %s: %w", sb.ID(), err)))
			}
		}()
	} else {
		defer a.keepsRunning(sb)
	}
	if err := a.waitWithProgress(ctx, sb, sb.Info().Image); err != nil {
		return err
	}
	return a.afterCreate(ctx, sb, argv, len(spec.Publish) > 0, interactive)
}

// containerKey is --container's key for a single-container flag of run.
func containerKey(flag string) string {
	switch flag {
	case "env":
		return "env=K=V"
	case "main":
		return "command=EXE,arg=ARG…"
	}
	return flag + "=…"
}

// keepsRunning tells, on stderr whatever it is, that a sandbox sbx created outlives it,
// until when and how to stop it; nothing for one that has already ended.
func (a *app) keepsRunning(sb *sandbox.Sandbox) {
	in := sb.Info()
	if in.State.Terminal() {
		return
	}
	until := ""
	if !in.ExpiresAt.IsZero() {
		until = " until " + localTime(in.ExpiresAt)
	}
	_, _ = fmt.Fprintf(a.stderr, "sbx: sandbox %s keeps running%s (stop it with: sbx stop %s)\n", sb.ID(), until, sb.ID())
}

// execResult records the exit code of a command run in a sandbox. One that could not
// start exits as a shell would (127 not found, 126 not executable), after its error.
func (a *app) execResult(code int, err error) error {
	if err != nil && sandbox.ReasonOf(err) == sandbox.ReasonStartFailed && code > 0 {
		a.exitCode = code
	}
	if err == nil {
		a.exitCode = code
	}
	return err
}

// egressFlag parses --egress RULE (see sandbox.ParseEgress).
type egressFlag struct{ to *[]sandbox.EgressRule }

func (e egressFlag) String() string { return "" }
func (e egressFlag) Type() string   { return "RULE" }
func (e egressFlag) Set(v string) error {
	r, err := sandbox.ParseEgress(v)
	if err != nil {
		return err
	}
	*e.to = append(*e.to, r)
	return nil
}

// publishFlag parses --publish PORT:KIND[:token].
type publishFlag struct{ to *[]sandbox.Endpoint }

func (p publishFlag) String() string { return "" }
func (p publishFlag) Type() string   { return "PORT:KIND" }
func (p publishFlag) Set(v string) error {
	parts := strings.Split(v, ":")
	port, err := strconv.Atoi(parts[0])
	if err != nil || port < 1 || port > 65535 || len(parts) < 2 || len(parts) > 3 {
		return fmt.Errorf("want PORT:https, PORT:https:token or PORT:tls, got %q", v)
	}
	e := sandbox.Endpoint{Port: port}
	switch kind := strings.Join(parts[1:], ":"); kind {
	case "https":
		e.Kind = sandbox.HTTPS
	case "https:token":
		e.Kind, e.Token = sandbox.HTTPS, true
	case "tls", "tls-passthrough":
		e.Kind = sandbox.TLSPassthrough
	default:
		return fmt.Errorf("unknown endpoint kind %q: want https, https:token or tls", kind)
	}
	*p.to = append(*p.to, e)
	return nil
}

// printShareToken prints, on stderr, the share token of sb's SHARE_TOKEN endpoints: the
// create response is the only place the API ever returns it.
func (a *app) printShareToken(sb *sandbox.Sandbox) {
	if t := sb.ShareToken(); t != "" {
		_, _ = fmt.Fprintf(a.stderr, "share token (shown only now; send it as header X-Sandbox-Share-Token): %s\n", t)
	}
}

// printEndpoints lists a sandbox's endpoints, with a hint for names that DNS does not
// resolve (anything not under .localhost, when the edge is on this machine).
func (a *app) printEndpoints(w io.Writer, in sandbox.Info) {
	for _, e := range in.Endpoints {
		addr := e.Address
		if addr == "" {
			addr = "(published once the sandbox runs)"
		}
		auth := ""
		if e.Auth != "" {
			auth = "\tauth: " + e.Auth
		}
		_, _ = fmt.Fprintf(w, "%d/%s\t%s%s\n", e.Port, e.Kind, addr, auth)
		if host := endpointHost(e.Address); host != "" && !strings.HasSuffix(host, ".localhost") {
			_, _ = fmt.Fprintf(w, "\t(without DNS for it: curl --resolve %s:EDGE-IP …)\n", host)
		}
	}
}

func endpointHost(addr string) string {
	addr = strings.TrimPrefix(addr, "https://")
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// progressText is what a sandbox in state st does, as far as its state tells.
func progressText(st sandbox.State, image string) string {
	switch st {
	case sandbox.StatePending:
		return "waiting for a runner…"
	case sandbox.StateCreating, sandbox.StateUnspecified:
		if image == "" {
			return "starting…"
		}
		return "pulling image " + image + " and starting…"
	}
	return st.String() + "…"
}

func parseEnv(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			if k != "" {
				if val, set := os.LookupEnv(k); set {
					env[k] = val
					continue
				}
			}
			return nil, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		env[k] = v
	}
	return env, nil
}

func (a *app) lsCommand() *cobra.Command {
	var (
		opts  sandbox.ListOptions
		state string
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if state != "" {
				st, err := sandbox.ParseState(state)
				if err != nil {
					return err
				}
				opts.State = st
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.List(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if a.json() {
				return printJSONList(a, list, func(sb *sandbox.Sandbox) protoMessage { return sb.Proto() })
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "ID\tSTATE\tIMAGE\tAGE\tTAGS")
			for _, sb := range list {
				in := sb.Info()
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", in.ID, in.State, in.Image, age(in.CreatedAt), strings.Join(in.Tags, ","))
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&opts.Tags, "tag", nil, "only sandboxes with this tag (repeatable: all must match)")
	f.BoolVarP(&opts.ShowTerminated, "all", "a", false, "include ended sandboxes")
	f.StringVar(&state, "status", "", "only sandboxes in this state (running, completed, failed, …)")
	f.StringArrayVar(&opts.RunnerIDs, "runner-id", nil, "only sandboxes on this runner (repeatable)")
	return cmd
}

func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return humanDuration(time.Since(t))
}

func (a *app) getCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show a sandbox (with several containers, each one's state, exit code and restarts)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(sb.Proto())
			}
			in := sb.Info()
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			row := func(k, v string) {
				if v != "" {
					_, _ = fmt.Fprintf(tw, "%s:\t%s\n", k, v)
				}
			}
			row("ID", in.ID)
			row("State", in.State.String())
			if in.State == sandbox.StatePaused {
				row("Resume", "sbx resume "+in.ID+" (exec, files and endpoint traffic resume it too unless paused with --no-auto-resume)")
			}
			row("Reason", in.Reason)
			if in.ExitCode != nil {
				row("Exit code", fmt.Sprint(*in.ExitCode))
			}
			row("Image", in.Image)
			if in.SourceTemplateID != "" {
				row("Template", fmt.Sprintf("%s (revision %d)", in.SourceTemplateID, in.SourceTemplateRevision))
			}
			row("Runner", in.RunnerID)
			row("Tags", strings.Join(in.Tags, ","))
			now := time.Now()
			row("Created", humanTime(in.CreatedAt, now))
			row("Started", humanTime(in.StartedAt, now))
			row("Ended", humanTime(in.EndedAt, now))
			if in.Lifetime > 0 {
				row("Lifetime", humanDuration(in.Lifetime))
			}
			if !in.State.Terminal() {
				row("Expires", humanTime(in.ExpiresAt, now))
			}
			row("CPU", requestLimit(in.Requests.CPU, in.Limits.CPU, humanCPU))
			row("Memory", requestLimit(in.Requests.Memory, in.Limits.Memory, humanMemory))
			if in.State != sandbox.StateUnspecified {
				row("Restarts", fmt.Sprint(in.Restarts))
			}
			egress := make([]string, len(in.Egress))
			for i, r := range in.Egress {
				egress[i] = r.String()
			}
			switch {
			case len(egress) > 0:
				row("Egress", strings.Join(egress, "; "))
			case in.State != sandbox.StateUnspecified:
				row("Egress", "none (only the platform DNS)")
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(in.Containers) > 1 {
				_, _ = fmt.Fprintln(a.stdout, "Containers:")
				if err := printContainers(a.stdout, in.Containers); err != nil {
					return err
				}
			}
			if len(in.Endpoints) > 0 {
				_, _ = fmt.Fprintln(a.stdout, "Endpoints:")
				ew := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				a.printEndpoints(ew, in)
				return ew.Flush()
			}
			return nil
		},
	}
}

// requestLimit renders a resource's request and limit: "100m CPU requested, limit 1 CPU".
func requestLimit(req, limit string, human func(string) string) string {
	switch {
	case req == "" && limit == "":
		return ""
	case req == limit:
		return human(req)
	case limit == "":
		return human(req) + " requested, no limit"
	case req == "":
		return "limit " + human(limit)
	}
	return human(req) + " requested, limit " + human(limit)
}

func (a *app) execCommand() *cobra.Command {
	var (
		interactive bool
		opts        sandbox.ExecOptions
		env         []string
	)
	cmd := &cobra.Command{
		Use:   "exec [-c CONTAINER] ID -- CMD...",
		Short: "Run a command in a sandbox and exit with its code",
		Long: `exec runs CMD in the sandbox, streaming its output, and exits with its exit code:
127 when CMD is not found, 126 when it cannot be executed, 130 on Ctrl-C (which ends
CMD). stdin is forwarded when it is not a terminal, or with -i.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if opts.Env, err = parseEnv(env); err != nil {
				return err
			}
			opts.Stdout, opts.Stderr = a.stdout, a.stderr
			if a.stdin != nil && (interactive || !isTerminal(a.stdin)) {
				opts.Stdin = a.stdin
			}
			return a.execResult(c.Sandbox(args[0]).Exec(cmd.Context(), args[1:], opts))
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&interactive, "interactive", "i", false, "forward stdin even from a terminal")
	f.StringVar(&opts.Cwd, "cwd", "", "run in this directory")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	containerFlagVar(cmd, &opts.Container)
	return cmd
}

func (a *app) logsCommand() *cobra.Command {
	var (
		opts  sandbox.LogOptions
		since string
	)
	cmd := &cobra.Command{
		Use:   "logs [-c CONTAINER] ID",
		Short: "Print the main command's output (of the primary container, or -c's)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return err
				}
				opts.Since = t
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.Sandbox(args[0]).Logs(cmd.Context(), opts, a.stdout)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&opts.Follow, "follow", "f", false, "keep printing new output")
	f.IntVar(&opts.Tail, "tail", 0, "only the last N lines")
	f.BoolVarP(&opts.Timestamps, "timestamps", "t", false, "prefix lines with their time")
	f.StringVar(&since, "since", "", "only output since a time (RFC 3339) or a duration ago (e.g. 5m)")
	containerFlagVar(cmd, &opts.Container)
	return cmd
}

func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want a duration (5m) or an RFC 3339 time", s)
	}
	return t, nil
}

func (a *app) stopCommand() *cobra.Command {
	var (
		grace     time.Duration
		missingOK bool
		snapshots []string
		noWait    bool
	)
	cmd := &cobra.Command{
		Use:   "stop ID [--snapshot-volume NAME]...",
		Short: "Stop a sandbox and wait until it has ended",
		Long: `stop stops a sandbox and waits until it has ended. With --snapshot-volume NAME
(repeatable) the runner first snapshots those scratch volumes and stop waits until the
snapshots are ready (not with --no-wait-snapshots: then they may still be creating; see
sbx snapshot get ID). Their IDs are printed as "snapshot NAME ID" lines.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			if len(snapshots) > 0 {
				return a.stopWithSnapshots(cmd, c, sb, grace, snapshots, !noWait)
			}
			if err := sb.Stop(cmd.Context(), grace); err != nil {
				if missingOK && errors.Is(err, sandbox.ErrNotFound) {
					return nil
				}
				return err
			}
			if a.json() {
				return a.printJSON(sb.Proto())
			}
			_, err = fmt.Fprintf(a.stdout, "%s %s\n", sb.ID(), sb.State())
			return err
		},
	}
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "time the main command has to exit after SIGTERM")
	cmd.Flags().BoolVar(&missingOK, "missing-ok", false, "succeed if the sandbox does not exist")
	cmd.Flags().StringArrayVar(&snapshots, "snapshot-volume", nil, "snapshot this scratch volume before the sandbox stops (repeatable); prints the snapshot IDs")
	cmd.Flags().BoolVar(&noWait, "no-wait-snapshots", false, "with --snapshot-volume: do not wait until the snapshots are ready")
	cmd.MarkFlagsMutuallyExclusive("missing-ok", "snapshot-volume")
	return cmd
}

func (a *app) deleteCommand() *cobra.Command {
	var missingOK bool
	cmd := &cobra.Command{
		Use:     "delete ID...",
		Aliases: []string{"rm"},
		Short:   "Delete sandboxes at once",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.Delete(cmd.Context(), id); err != nil && !(missingOK && errors.Is(err, sandbox.ErrNotFound)) {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&missingOK, "missing-ok", false, "succeed if a sandbox does not exist")
	return cmd
}

func (a *app) lifetimeCommand() *cobra.Command {
	var extend, set time.Duration
	cmd := &cobra.Command{
		Use:   "lifetime ID (--extend DURATION | --set DURATION)",
		Short: "Extend or shorten a running sandbox's lifetime",
		Long: `lifetime changes a running sandbox's lifetime within its runner policy's maximum:
--extend adds to it (a negative duration shortens it), --set makes the total lifetime,
counted from the sandbox's creation, DURATION. A lifetime already over stops the sandbox
as its end does. It prints the new lifetime and deadline.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ext, st := cmd.Flags().Changed("extend"), cmd.Flags().Changed("set")
			if ext == st {
				return errors.New("give exactly one of --extend DURATION or --set DURATION")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var lt sandbox.Lifetime
			if ext {
				lt, err = c.ExtendLifetime(cmd.Context(), args[0], extend)
			} else {
				lt, err = c.SetLifetime(cmd.Context(), args[0], set)
			}
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "%s lifetime %s, until %s\n", args[0], lt.Max, lt.Deadline.UTC().Format(time.RFC3339))
			return err
		},
	}
	cmd.Flags().DurationVar(&extend, "extend", 0, "add this to the lifetime (negative: shorten)")
	cmd.Flags().DurationVar(&set, "set", 0, "make the total lifetime, from the sandbox's creation, this")
	cmd.MarkFlagsMutuallyExclusive("extend", "set")
	return cmd
}

func (a *app) purgeCommand() *cobra.Command {
	var opts sandbox.PurgeOptions
	cmd := &cobra.Command{
		Use:   "purge (--tag TAG... | --all) [--dry-run]",
		Short: "Stop every active sandbox with the given tags, or all of them",
		Long: `purge deletes at once (no grace period) the active sandboxes that carry every --tag,
or with --all every active sandbox of your organization. --dry-run prints how many it
would stop and their IDs, and stops nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (len(opts.Tags) > 0) == opts.All {
				return errors.New("give exactly one scope: --tag TAG (repeatable) or --all")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var ids []string
			if opts.DryRun {
				// The API only counts: the IDs come from a list with the same filter.
				list, err := c.List(ctx, sandbox.ListOptions{Tags: opts.Tags})
				if err != nil {
					return err
				}
				for _, sb := range list {
					if st := sb.State(); st != sandbox.StateTerminating && !st.Terminal() {
						ids = append(ids, sb.ID())
					}
				}
			}
			res, err := c.Purge(ctx, opts)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(map[string]any{"dry_run": opts.DryRun, "purge_count": res.Count, "sandbox_ids": ids,
					"failed_sandbox_ids": res.Failed, "retryable_failed_sandbox_ids": res.Retryable})
			}
			verb := "stopped"
			if opts.DryRun {
				verb = "would stop"
			}
			_, _ = fmt.Fprintf(a.stdout, "%s %d %s\n", verb, res.Count, plural(res.Count, "sandbox", "sandboxes"))
			for _, id := range ids {
				_, _ = fmt.Fprintln(a.stdout, id)
			}
			if n := len(res.Failed) + len(res.Retryable); n > 0 {
				return fmt.Errorf("could not stop %d %s: %s", n, plural(n, "sandbox", "sandboxes"),
					strings.Join(append(append([]string(nil), res.Failed...), res.Retryable...), " "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&opts.Tags, "tag", nil, "only sandboxes with this tag (repeatable: all must match)")
	f.BoolVar(&opts.All, "all", false, "every active sandbox of your organization")
	f.BoolVar(&opts.DryRun, "dry-run", false, "print what would be stopped, stop nothing")
	return cmd
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
