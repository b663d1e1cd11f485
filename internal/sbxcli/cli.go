// Package sbxcli is the `sbx` command line: a thin cobra layer over the Go SDK
// (sdk/go). cmd/sbx only calls Execute, so tests run the same commands in-process.
package sbxcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sandboxd/sandboxd/internal/version"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// app is one invocation: its streams, global flags and the exit code a command chose.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	baseURL, apiKey, caFile, output string
	dataPlane                       string
	exitCode                        int
	// quiet: sbx run shows no start progress (--quiet).
	quiet bool
	// ran is set once the arguments passed cobra's checks: an error before that is a
	// usage error and gets a hint.
	ran bool
}

// Execute runs sbx with args (without the program name) and returns the exit code.
func Execute(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return ExecuteContext(context.Background(), args, stdin, stdout, stderr)
}

// ExecuteContext is Execute with a context that cancels the running command: a
// context canceled by SignalContext exits 128+signal (130 for SIGINT), any other
// cancellation 130.
func ExecuteContext(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if ctx.Err() != nil {
		_, _ = fmt.Fprintln(stderr, "sbx: interrupted")
		return interruptedCode(ctx)
	}
	if err != nil {
		_, _ = fmt.Fprintln(stderr, FormatError(err))
		if !a.ran && cmd != nil {
			_, _ = fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		if a.exitCode != 0 {
			return a.exitCode
		}
		return 1
	}
	return a.exitCode
}

// Interrupted is the cause of a context SignalContext canceled.
type Interrupted struct{ Signal syscall.Signal }

func (i Interrupted) Error() string { return "interrupted by " + i.Signal.String() }

// SignalContext returns ctx canceled, with cause Interrupted, on the first SIGINT,
// SIGTERM or SIGHUP; after it those signals act as by default again, so a second
// Ctrl-C ends sbx at once even while it cleans up.
func SignalContext(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			signal.Stop(ch)
			s, _ := sig.(syscall.Signal)
			cancel(Interrupted{Signal: s})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel(nil)
	}
}

// interruptedCode is a shell's exit code for a command killed by the signal that
// canceled ctx.
func interruptedCode(ctx context.Context) int {
	var in Interrupted
	if errors.As(context.Cause(ctx), &in) && in.Signal > 0 {
		return 128 + int(in.Signal)
	}
	return 128 + int(syscall.SIGINT)
}

// FormatError renders err as `sbx: <message> (<REASON>)`: the API's CWSANDBOX_* reason,
// else its status code, else nothing in parentheses.
func FormatError(err error) string {
	var e *sandbox.Error
	if errors.As(err, &e) {
		tag := e.Reason
		if tag == "" {
			tag = strings.ToUpper(e.Code.String())
		}
		msg := err.Error()
		if msg == "" {
			msg = strings.ToLower(tag)
		}
		return fmt.Sprintf("sbx: %s (%s)", msg, tag)
	}
	var se *sandbox.StateError
	if errors.As(err, &se) {
		return fmt.Sprintf("sbx: %s (%s)", err.Error(), strings.ToUpper(se.State.String()))
	}
	if errors.Is(err, context.Canceled) {
		return "sbx: interrupted"
	}
	return "sbx: " + err.Error()
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "sbx",
		Short: "Run and manage sandboxes (coreweave.sandbox.v1)",
		Long: `sbx runs and manages sandboxes through the coreweave.sandbox.v1 API.

It talks to CWSANDBOX_BASE_URL (http:// for plaintext, https:// for TLS) with the API key
in CWSANDBOX_API_KEY; --base-url and --api-key override them.`,
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case a.output == "yaml" && cmd.Annotations[yamlOutput] == "":
				return fmt.Errorf("-o yaml is for %s only; here -o must be text or json", "sbx template get")
			case a.output != "text" && a.output != "json" && a.output != "yaml":
				return fmt.Errorf("-o must be text or json, not %q", a.output)
			}
			a.ran = true
			return nil
		},
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetVersionTemplate("sbx {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	pf := root.PersistentFlags()
	pf.StringVar(&a.baseURL, "base-url", "", "API endpoint, e.g. http://127.0.0.1:8080 (default $"+sandbox.EnvBaseURL+", which sandboxd dev prints)")
	pf.StringVar(&a.apiKey, "api-key", "", "API key (default $"+sandbox.EnvAPIKey+")")
	pf.StringVar(&a.caFile, "ca-file", "", "extra PEM CA certificates to trust for https:// endpoints")
	pf.StringVarP(&a.output, "output", "o", "text", "output format: text or json (sbx template get: also yaml)")
	pf.StringVar(&a.dataPlane, "data-plane", "auto", "how exec, logs and files reach a sandbox: auto (direct to its runner when it answers within 1 s, else the gateway), direct or gateway")
	root.AddCommand(a.runCommand(), a.lsCommand(), a.getCommand(), a.execCommand(), a.shCommand(),
		a.logsCommand(), a.filesCommand(), a.cpCommand(), a.composeCommand(), a.stopCommand(), a.deleteCommand(), a.pauseCommand(), a.resumeCommand(), a.forkCommand(), a.lifetimeCommand(), a.purgeCommand(),
		a.snapshotCommand(), a.templateCommand(), a.volumeCommand(), a.buildCommand(), a.secretCommand(), a.quotaCommand(), a.adminCommand())
	root.InitDefaultCompletionCmd()
	if c, _, err := root.Find([]string{"completion"}); err == nil && c != root {
		c.Long += completionHelp
	}
	strictGroups(root)
	return root
}

const completionHelp = `
To load completions for the current shell session:

  source <(sbx completion bash)          # bash (needs the bash-completion package)
  source <(sbx completion zsh)           # zsh (after compinit)
  sbx completion fish | source           # fish

To load them for every session, write the script where the shell looks for completions,
e.g. sbx completion bash > /etc/bash_completion.d/sbx.
`

// strictGroups makes every command that only holds subcommands refuse an unknown one
// (cobra would print the help and succeed) and print its help when given none.
func strictGroups(c *cobra.Command) {
	for _, sub := range c.Commands() {
		strictGroups(sub)
	}
	if !c.HasSubCommands() || c.Runnable() {
		return
	}
	c.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, ", "))
		}
		return errors.New(msg)
	}
	c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
}

// errNoEndpoint replaces the SDK's sandbox.ErrNoBaseURL with what to do about it.
var errNoEndpoint = errors.New("no API endpoint: set " + sandbox.EnvBaseURL + " (sandboxd dev prints it) or --base-url")

func (a *app) client() (*sandbox.Client, error) {
	mode, err := sandbox.ParseDataPlaneMode(a.dataPlane)
	if err != nil {
		return nil, fmt.Errorf("--data-plane: %w", err)
	}
	c, err := sandbox.New(a.baseURL, a.apiKey, append(a.clientOptions(), sandbox.WithDataPlane(mode))...)
	if errors.Is(err, sandbox.ErrNoBaseURL) {
		return nil, errNoEndpoint
	}
	return c, err
}

// clientOptions are the connection options of both the sandbox and the admin client.
func (a *app) clientOptions() []sandbox.Option {
	opts := []sandbox.Option{sandbox.WithUserAgent("sbx")}
	if a.caFile != "" {
		opts = append(opts, sandbox.WithCAFile(a.caFile))
	}
	return opts
}

func (a *app) json() bool { return a.output == "json" }

// printJSON writes v (a proto message or anything encoding/json takes) indented.
func (a *app) printJSON(v any) error {
	var b []byte
	var err error
	switch x := v.(type) {
	case protoMessage:
		b, err = protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(x)
	default:
		b, err = json.MarshalIndent(v, "", "  ")
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

// printJSONList writes list as one JSON array of its items' messages (msg gives each
// item's), so `-o json` of every ls command has the same shape.
func printJSONList[T any](a *app, list []T, msg func(T) protoMessage) error {
	items := make([]json.RawMessage, len(list))
	for i, x := range list {
		b, err := protojson.Marshal(msg(x))
		if err != nil {
			return err
		}
		items[i] = b
	}
	return a.printJSON(items)
}

// isTerminal reports whether v is a terminal (an *os.File on a tty).
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
