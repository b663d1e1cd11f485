package sbxcli

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/quantity"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// containerFlag parses --container KEY=VALUE,… into one more container; a value holding
// a comma is quoted as in CSV ("arg=a,b"). Errors surface at flag parsing, with the
// usage hint.
type containerFlag struct{ to *[]sandbox.Container }

func (c containerFlag) String() string { return "" }
func (c containerFlag) Type() string   { return "name=N,image=I,…" }
func (c containerFlag) Set(v string) error {
	ct, err := parseContainer(v)
	if err != nil {
		return err
	}
	*c.to = append(*c.to, ct)
	return nil
}

// containerHelp lists --container's keys, for run's help.
const containerHelp = `a container of a multi-container sandbox (repeatable): comma-separated
name=NAME (required), image=IMAGE (required), command=EXE, arg=ARG (repeatable), env=K=V
(repeatable), cpu=QTY, memory=QTY, workdir=DIR, probe=SHELL-CMD (a startup probe run by
/bin/sh -c until it exits 0) and primary; quote a value with a comma: "arg=a,b"`

// dnsLabel is a container name as the server accepts it (RFC 1123 label).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// maxContainerSpec bounds one --container value: it is typed, not a file.
const maxContainerSpec = 64 << 10

// parseContainer parses one --container value.
func parseContainer(v string) (sandbox.Container, error) {
	var c sandbox.Container
	if strings.TrimSpace(v) == "" {
		return c, errors.New("empty container: want name=NAME,image=IMAGE[,…]")
	}
	if len(v) > maxContainerSpec {
		return c, fmt.Errorf("container spec of %d bytes: at most %d", len(v), maxContainerSpec)
	}
	r := csv.NewReader(strings.NewReader(v))
	r.FieldsPerRecord = -1
	fields, err := r.Read()
	if err != nil {
		return c, fmt.Errorf("container %q: %w", v, err)
	}
	if _, err := r.Read(); !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("container %q: one line only", v)
	}
	seen := map[string]bool{}
	once := func(k string) error {
		if seen[k] {
			return fmt.Errorf("container %q: %s given twice", v, k)
		}
		seen[k] = true
		return nil
	}
	for _, f := range fields {
		k, val, hasValue := strings.Cut(f, "=")
		k = strings.TrimSpace(k)
		if k == "primary" {
			if err := once(k); err != nil {
				return c, err
			}
			c.Primary = true
			if hasValue {
				b, err := strconv.ParseBool(val)
				if err != nil {
					return c, fmt.Errorf("container %q: primary=%q: want true or false", v, val)
				}
				c.Primary = b
			}
			continue
		}
		if !hasValue {
			if k == "" {
				return c, fmt.Errorf("container %q: an empty field (two commas?)", v)
			}
			return c, fmt.Errorf("container %q: %q: want KEY=VALUE", v, f)
		}
		switch k {
		case "arg":
			c.Args = append(c.Args, val)
			continue
		case "env":
			ek, ev, ok := strings.Cut(val, "=")
			if !ok || ek == "" {
				return c, fmt.Errorf("container %q: env=%q: want env=KEY=VALUE", v, val)
			}
			if _, dup := c.Env[ek]; dup {
				return c, fmt.Errorf("container %q: env %s given twice", v, ek)
			}
			if c.Env == nil {
				c.Env = map[string]string{}
			}
			c.Env[ek] = ev
			continue
		}
		if val == "" {
			return c, fmt.Errorf("container %q: %s is empty", v, k)
		}
		switch k {
		case "name", "image", "command", "cpu", "memory", "workdir", "probe":
			if err := once(k); err != nil {
				return c, err
			}
		}
		switch k {
		case "name":
			if !dnsLabel.MatchString(val) {
				return c, fmt.Errorf("container name %q: want lower case letters, digits and '-' (a DNS label, at most 63)", val)
			}
			c.Name = val
		case "image":
			c.Image = val
		case "command", "cmd":
			if k == "cmd" {
				if err := once("command"); err != nil {
					return c, err
				}
			}
			c.Command = val
		case "cpu":
			if n, err := quantity.ParseCPU(val); err != nil || n <= 0 {
				return c, fmt.Errorf("container %q: cpu=%q: want a CPU quantity such as 500m or 2", v, val)
			}
			c.CPU = val
		case "memory":
			if n, err := quantity.ParseMemory(val); err != nil || n <= 0 {
				return c, fmt.Errorf("container %q: memory=%q: want a size such as 256Mi or 1Gi", v, val)
			}
			c.Memory = val
		case "workdir":
			c.WorkingDir = val
		case "probe":
			c.StartupProbe = &sandbox.Probe{Exec: []string{"/bin/sh", "-c", val}}
		default:
			return c, fmt.Errorf("container %q: unknown key %q (want name, image, command, arg, env, cpu, memory, workdir, probe or primary)", v, k)
		}
	}
	switch {
	case c.Name == "":
		return c, fmt.Errorf("container %q: name=NAME is required", v)
	case c.Image == "":
		return c, fmt.Errorf("container %q: image=IMAGE is required", v)
	}
	return c, nil
}

// checkContainers checks what holds across the containers: names unique, at most one
// primary (none makes the first the primary).
func checkContainers(cs []sandbox.Container) error {
	seen := map[string]bool{}
	var primaries []string
	for _, c := range cs {
		if seen[c.Name] {
			return fmt.Errorf("--container: two containers are named %q", c.Name)
		}
		seen[c.Name] = true
		if c.Primary {
			primaries = append(primaries, c.Name)
		}
	}
	if len(primaries) > 1 {
		return fmt.Errorf("--container: %s are all marked primary: mark one (or none: the first is the primary)", strings.Join(primaries, ", "))
	}
	return nil
}

// primaryImage is the image of the primary container (for progress lines).
func primaryImage(cs []sandbox.Container) string {
	for _, c := range cs {
		if c.Primary {
			return c.Image
		}
	}
	if len(cs) > 0 {
		return cs[0].Image
	}
	return ""
}

// containerFlagVar adds -c/--container NAME to a command that reaches into a sandbox.
func containerFlagVar(cmd *cobra.Command, to *string) {
	cmd.Flags().StringVarP(to, "container", "c", "", "the container of a multi-container sandbox (default: the primary)")
}

// printContainers writes a sandbox's containers as a table (get's human output).
func printContainers(w io.Writer, cs []sandbox.ContainerInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "NAME\tPRIMARY\tIMAGE\tSTATE\tEXIT\tRESTARTS")
	for _, c := range cs {
		primary, state, exit := "", "-", "-"
		if c.Primary {
			primary = "yes"
		}
		if c.State != sandbox.StateUnspecified {
			state = c.State.String()
		}
		if c.ExitCode != nil {
			exit = strconv.Itoa(*c.ExitCode)
		}
		image := c.Image
		if image == "" {
			image = "-"
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", c.Name, primary, image, state, exit, c.Restarts)
	}
	return tw.Flush()
}

// imageFlag parses --image SERVICE=IMAGE into a map, refusing a service given twice.
type imageFlag struct{ to *map[string]string }

func (f imageFlag) String() string { return "" }
func (f imageFlag) Type() string   { return "SERVICE=IMAGE" }
func (f imageFlag) Set(v string) error {
	svc, img, ok := strings.Cut(v, "=")
	if !ok || svc == "" || img == "" {
		return fmt.Errorf("want SERVICE=IMAGE, got %q", v)
	}
	if *f.to == nil {
		*f.to = map[string]string{}
	}
	if _, dup := (*f.to)[svc]; dup {
		return fmt.Errorf("service %q given twice", svc)
	}
	(*f.to)[svc] = img
	return nil
}

// readBounded reads path ("-" = stdin) up to limit bytes; a larger file is an error,
// never a silently truncated one.
func (a *app) readBounded(path string, limit int) ([]byte, error) {
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
		if fi, err := f.Stat(); err == nil && !fi.Mode().IsRegular() && fi.Mode()&os.ModeNamedPipe == 0 {
			return nil, fmt.Errorf("%s is not a regular file", path)
		}
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > limit {
		return nil, fmt.Errorf("%s is larger than %d KiB, the most a sandbox file may have", path, limit>>10)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return data, nil
}

func (a *app) composeCommand() *cobra.Command {
	compose := &cobra.Command{Use: "compose", Short: "Run a Compose file as a multi-container sandbox"}
	var (
		spec sandbox.FileSpec
		file string
	)
	up := &cobra.Command{
		Use:   "up -f FILE",
		Short: "Create a sandbox from a Compose file and wait until it runs",
		Long: `up sends a Compose file (read here, at most 256 KiB; - reads stdin) to the API, which
makes each service a container of one sandbox: they share its network (every service
name resolves to 127.0.0.1) and its lifetime, start in the order depends_on gives, and
the sandbox runs once the primary has started and every health check it waits for has
passed. A service that fails its health check fails the sandbox, naming the service.
The sandbox's ID goes to stdout; reach a service with -c: sbx exec -c SERVICE ID -- CMD.

  sbx compose up -f compose.yaml --primary app
  sbx compose up -f compose.yaml --image redis=redis:7.2 --cpu 500m --memory 256Mi`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			data, err := a.readBounded(file, sandbox.MaxSandboxFileBytes)
			if err != nil {
				return err
			}
			spec.Contents = data
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.CreateFromFile(ctx, spec)
			if err != nil {
				return err
			}
			defer a.keepsRunning(sb)
			if err := a.waitWithProgress(ctx, sb, ""); err != nil {
				return err
			}
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
		},
	}
	f := up.Flags()
	f.StringVarP(&file, "file", "f", "", "the Compose file (- for stdin)")
	_ = up.MarkFlagRequired("file")
	f.StringVar(&spec.PrimaryService, "primary", "", "the primary service: its exit ends the sandbox, and exec, files and logs go to it by default (default: the server's choice)")
	f.Var(imageFlag{&spec.ImageOverrides}, "image", "run SERVICE with IMAGE instead of the file's (repeatable)")
	f.StringVar(&spec.CPU, "cpu", "", `CPU of a service that sets no deploy.resources, e.g. "500m"`)
	f.StringVar(&spec.Memory, "memory", "", `memory of a service that sets no deploy.resources, e.g. "256Mi"`)
	f.DurationVar(&spec.Lifetime, "lifetime", 0, "maximum lifetime (default: the platform's)")
	f.StringArrayVar(&spec.Tags, "tag", nil, "tag (repeatable)")
	f.StringArrayVar(&spec.RunnerIDs, "runner", nil, "place on this runner (repeatable)")
	f.StringVar(&spec.DisplayName, "name", "", "display name")
	f.BoolVar(&spec.Engine, "engine", false, "run the file under a container engine inside the sandbox (docker compose), where a runner supports it")
	f.Var(egressFlag{&spec.Egress}, "egress", "allow egress to: any, cidr=PREFIX, dns=NAME or tenant=same_org|same_user; repeatable")
	f.BoolVar(&spec.DenyEgress, "deny-egress", false, "allow no egress at all (the platform DNS still answers)")
	up.MarkFlagsMutuallyExclusive("egress", "deny-egress")
	compose.AddCommand(up)
	return compose
}
