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
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/protobuf/encoding/protojson"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// app is one invocation: its streams, global flags and the exit code a command chose.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	baseURL, apiKey, caFile, output string
	dataPlane                       string
	exitCode                        int
}

// Execute runs sbx with args (without the program name) and returns the exit code.
func Execute(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return ExecuteContext(context.Background(), args, stdin, stdout, stderr)
}

// ExecuteContext is Execute with a context that cancels the running command.
func ExecuteContext(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		_, _ = fmt.Fprintln(stderr, FormatError(err))
		if a.exitCode != 0 {
			return a.exitCode
		}
		return 1
	}
	return a.exitCode
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
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if a.output != "text" && a.output != "json" {
				return fmt.Errorf("-o must be text or json, not %q", a.output)
			}
			return nil
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	pf := root.PersistentFlags()
	pf.StringVar(&a.baseURL, "base-url", "", "API endpoint (default $"+sandbox.EnvBaseURL+", else "+sandbox.DefaultBaseURL+")")
	pf.StringVar(&a.apiKey, "api-key", "", "API key (default $"+sandbox.EnvAPIKey+")")
	pf.StringVar(&a.caFile, "ca-file", "", "extra PEM CA certificates to trust for https:// endpoints")
	pf.StringVarP(&a.output, "output", "o", "text", "output format: text or json")
	pf.StringVar(&a.dataPlane, "data-plane", "auto", "how exec, logs and files reach a sandbox: auto (direct to its runner when it answers within 1 s, else the gateway), direct or gateway")
	root.AddCommand(a.runCommand(), a.lsCommand(), a.getCommand(), a.execCommand(), a.shCommand(),
		a.logsCommand(), a.filesCommand(), a.stopCommand(), a.deleteCommand(), a.adminCommand())
	return root
}

func (a *app) client() (*sandbox.Client, error) {
	mode, err := sandbox.ParseDataPlaneMode(a.dataPlane)
	if err != nil {
		return nil, fmt.Errorf("--data-plane: %w", err)
	}
	return sandbox.New(a.baseURL, a.apiKey, append(a.clientOptions(), sandbox.WithDataPlane(mode))...)
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

// isTerminal reports whether v is a terminal (an *os.File on a tty).
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
