package sbxcli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/quantity"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

func (a *app) filesCommand() *cobra.Command {
	files := &cobra.Command{Use: "files", Short: "Read, write, list, copy and remove files in a sandbox",
		Long: `files reads, writes, lists, copies and removes files in a sandbox: in its primary
container, or with -c NAME (every subcommand takes it) in the container NAME.`}
	var readContainer, writeContainer string
	read := &cobra.Command{
		Use:   "read ID PATH",
		Short: "Write a sandbox file to stdout",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			data, err := c.Sandbox(args[0]).InContainer(readContainer).ReadFile(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			_, err = a.stdout.Write(data)
			return err
		},
	}
	write := &cobra.Command{
		Use:   "write ID PATH [LOCAL]",
		Short: "Write stdin (or the local file LOCAL) to a sandbox file",
		Args:  cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			var data []byte
			var err error
			if len(args) == 3 {
				data, err = os.ReadFile(args[2])
			} else {
				if a.stdin == nil {
					return errors.New("nothing on stdin: give LOCAL or redirect a file")
				}
				data, err = io.ReadAll(io.LimitReader(a.stdin, sandbox.MaxFileBytes+1))
			}
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.Sandbox(args[0]).InContainer(writeContainer).WriteFile(cmd.Context(), args[1], data)
		},
	}
	containerFlagVar(read, &readContainer)
	containerFlagVar(write, &writeContainer)
	files.AddCommand(read, write, a.lsFilesCommand(), a.rmFilesCommand(), a.mkdirCommand(), a.cpCommand())
	return files
}

// inSandbox runs argv in container of sandbox id ("" = the primary) with sbx's stdout
// and stderr and exits with its code.
func (a *app) inSandbox(cmd *cobra.Command, id, container string, argv ...string) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	return a.execResult(c.Sandbox(id).Exec(cmd.Context(), argv, sandbox.ExecOptions{Stdout: a.stdout, Stderr: a.stderr, Container: container}))
}

func (a *app) lsFilesCommand() *cobra.Command {
	var container string
	cmd := &cobra.Command{
		Use:   "ls ID [PATH...]",
		Short: "List files in a sandbox (ls -lAh; default the working directory)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.inSandbox(cmd, args[0], container, append([]string{"ls", "-lAh", "--"}, args[1:]...)...)
		},
	}
	containerFlagVar(cmd, &container)
	return cmd
}

func (a *app) rmFilesCommand() *cobra.Command {
	var recursive, force bool
	var container string
	cmd := &cobra.Command{
		Use:   "rm ID PATH...",
		Short: "Remove files (with -r directories) in a sandbox",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := []string{"rm"}
			if recursive {
				argv = append(argv, "-r")
			}
			if force {
				argv = append(argv, "-f")
			}
			return a.inSandbox(cmd, args[0], container, append(append(argv, "--"), args[1:]...)...)
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	cmd.Flags().BoolVarP(&force, "force", "f", false, "ignore missing files")
	containerFlagVar(cmd, &container)
	return cmd
}

func (a *app) mkdirCommand() *cobra.Command {
	var parents bool
	var container string
	cmd := &cobra.Command{
		Use:   "mkdir ID PATH...",
		Short: "Create directories in a sandbox",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := []string{"mkdir"}
			if parents {
				argv = append(argv, "-p")
			}
			return a.inSandbox(cmd, args[0], container, append(append(argv, "--"), args[1:]...)...)
		},
	}
	cmd.Flags().BoolVarP(&parents, "parents", "p", false, "create parent directories as needed, no error if it exists")
	containerFlagVar(cmd, &container)
	return cmd
}

// cpCommand is `sbx cp` and `sbx files cp`.
func (a *app) cpCommand() *cobra.Command {
	var maxSize, container string
	var lim copyLimits
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files or directories between a sandbox and this machine",
		Long: `cp copies a file or a directory (recursively) between this machine and a sandbox;
one of SRC and DST is ID:PATH, the other a local path. As with cp -r, a DST that is an
existing directory receives SRC under its own name; otherwise DST becomes the copy.
The copy goes as a tar stream through exec, so the sandbox needs tar (busybox has it).

What comes from a sandbox is untrusted: nothing is written outside DST, entries with
absolute or .. paths fail the copy, symbolic links pointing outside DST, device files,
FIFOs and sockets are skipped (the copy then exits 1 after naming them), permissions
lose setuid, setgid and sticky bits, ownership is yours, and --max-size and --max-files
bound what is written.

  sbx cp ./project ID:/work          # /work/project, or /work if it does not exist
  sbx cp ID:/work/out ./out          # the sandbox's /work/out as ./out
  sbx cp -c cache ID:/data ./data    # from the container cache (default: the primary)`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := quantity.ParseMemory(maxSize)
			if err != nil || n <= 0 {
				return fmt.Errorf("--max-size %q: want a size such as 512Mi or 2Gi", maxSize)
			}
			lim.bytes = n
			srcID, srcPath, srcRemote := splitRemote(args[0])
			dstID, dstPath, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return errors.New("one of SRC and DST must be ID:PATH (a sandbox path), the other a local path")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if srcRemote {
				return a.download(cmd.Context(), c.Sandbox(srcID).InContainer(container), srcPath, dstPath, lim)
			}
			return a.upload(cmd.Context(), c.Sandbox(dstID).InContainer(container), srcPath, dstPath)
		},
	}
	f := cmd.Flags()
	f.StringVar(&maxSize, "max-size", "1Gi", "copying from a sandbox: fail beyond this many bytes of file content")
	f.IntVar(&lim.files, "max-files", 100000, "copying from a sandbox: fail beyond this many entries")
	containerFlagVar(cmd, &container)
	return cmd
}

// splitRemote splits "ID:PATH". A path with a slash before its first colon (./a:b,
// /tmp/x:y) or without a colon is local.
func splitRemote(s string) (id, path string, remote bool) {
	id, path, ok := strings.Cut(s, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", s, false
	}
	return id, path, true
}
