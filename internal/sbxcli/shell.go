package sbxcli

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

func (a *app) shCommand() *cobra.Command {
	var shell, container string
	cmd := &cobra.Command{
		Use:   "sh [-c CONTAINER] ID",
		Short: "Open an interactive shell in a sandbox",
		Long: `sh opens an interactive shell on a pseudo-terminal in the sandbox: bash when the image
has it, else /bin/sh (--cmd picks another). The local terminal is in raw mode while it
runs (restored afterwards) and window size changes are passed on. Without a terminal on
stdin the shell reads commands from stdin instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0]).InContainer(container)
			argv := []string{shell}
			if shell == "" {
				argv = autoShell
			}
			in, ok := a.stdin.(*os.File)
			if !ok || !term.IsTerminal(int(in.Fd())) {
				return a.execResult(sb.Exec(cmd.Context(), argv, sandbox.ExecOptions{Stdin: a.stdin, Stdout: a.stdout, Stderr: a.stderr}))
			}
			// Wait for the sandbox before taking over the terminal, so errors print normally.
			if err := a.waitWithProgress(cmd.Context(), sb, ""); err != nil {
				return err
			}
			fd := int(in.Fd())
			opts := sandbox.ExecOptions{Stdin: in, Stdout: a.stdout, Stderr: a.stdout, TTY: true}
			if w, h, err := term.GetSize(fd); err == nil {
				opts.Width, opts.Height = uint32(w), uint32(h)
			}
			resize := make(chan [2]uint32, 1)
			opts.Resize = resize
			winch := make(chan os.Signal, 1)
			signal.Notify(winch, syscall.SIGWINCH)
			defer signal.Stop(winch)
			stopResize := make(chan struct{})
			defer close(stopResize)
			go func() {
				for {
					select {
					case <-stopResize:
						return
					case <-winch:
						if w, h, err := term.GetSize(fd); err == nil {
							select {
							case resize <- [2]uint32{uint32(w), uint32(h)}:
							default:
							}
						}
					}
				}
			}()
			old, err := term.MakeRaw(fd)
			if err != nil {
				return err
			}
			code, err := sb.Exec(cmd.Context(), argv, opts)
			_ = term.Restore(fd, old)
			return a.execResult(code, err)
		},
	}
	cmd.Flags().StringVar(&shell, "cmd", "", "shell to run (default bash when the image has it, else /bin/sh)")
	containerFlagVar(cmd, &container)
	return cmd
}

// autoShell runs bash when the sandbox has it on its PATH, else sh: decided in the
// sandbox, in the same exec.
var autoShell = []string{"/bin/sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash; exec /bin/sh"}
