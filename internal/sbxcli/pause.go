package sbxcli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

func (a *app) pauseCommand() *cobra.Command {
	var release, freeze, noAutoResume bool
	cmd := &cobra.Command{
		Use:   "pause ID [--release | --freeze] [--no-auto-resume]",
		Short: "Pause a running sandbox (sbx resume continues it)",
		Long: `pause pauses a running sandbox: it shows as paused until sbx resume, or until exec,
file calls or endpoint traffic resume it (auto-resume, on unless --no-auto-resume or the
runner policy turns it off; then they fail with "sandbox not running").

By default a sandbox whose runtime class can be checkpointed (gvisor) is checkpointed:
memory, processes and files saved on its runner, its CPU and memory released; any other
(runc) is frozen in place, its memory kept and still counted. --release insists on a
checkpoint (refused with CWSANDBOX_CHECKPOINT_NOT_SUPPORTED where the runtime class
cannot), --freeze on a freeze. Whether the lifetime counts while paused is the runner
policy's setting. It prints how the sandbox was paused.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var opts sandbox.PauseOptions
			switch {
			case release:
				opts.ReleaseResources = &release
			case freeze:
				f := false
				opts.ReleaseResources = &f
			}
			if noAutoResume {
				f := false
				opts.AutoResume = &f
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ps, err := c.Pause(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(pauseJSON(ps))
			}
			how := "frozen (memory kept and still counted)"
			if ps.ResourcesReleased {
				how = "checkpointed, CPU and memory released (checkpoint " + humanBytes(ps.CheckpointBytes) + ")"
			}
			auto := "exec, files and endpoint traffic resume it"
			if !ps.AutoResume {
				auto = "auto-resume off: resume it with sbx resume " + ps.ID
			}
			lifetime := "its lifetime counts while paused"
			if ps.LifetimeHeld {
				lifetime = "its lifetime is held while paused"
			}
			_, err = fmt.Fprintf(a.stdout, "%s paused: %s; %s; %s\n", ps.ID, how, auto, lifetime)
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&release, "release", false, "checkpoint and release CPU and memory, or fail where the runtime class cannot (gvisor can)")
	f.BoolVar(&freeze, "freeze", false, "freeze in place (memory kept and counted)")
	f.BoolVar(&noAutoResume, "no-auto-resume", false, "exec, files and endpoint traffic fail while paused instead of resuming it")
	cmd.MarkFlagsMutuallyExclusive("release", "freeze")
	return cmd
}

// pauseJSON is sbx pause -o json's object (the API's PauseStatus, camelCase).
func pauseJSON(ps sandbox.PauseStatus) map[string]any {
	m := map[string]any{"sandboxId": ps.ID, "resourcesReleased": ps.ResourcesReleased, "autoResume": ps.AutoResume,
		"lifetimeHeld": ps.LifetimeHeld, "checkpointBytes": ps.CheckpointBytes}
	if !ps.PausedAt.IsZero() {
		m["pausedAt"] = ps.PausedAt.UTC().Format(time.RFC3339Nano)
	}
	return m
}

func (a *app) resumeCommand() *cobra.Command {
	var runners []string
	cmd := &cobra.Command{
		Use:   "resume ID [--runner R]...",
		Short: "Resume a paused sandbox",
		Long: `resume continues a paused sandbox under the same ID; its processes continue where
they were (a checkpointed sandbox's open TCP connections to the outside are reset). A
running sandbox is left as it is. It prints the runner it runs on and when its lifetime
now ends.

A checkpointed sandbox resumes on its own runner when that is allowed (--runner, repeated:
the runners it may resume on; none: any) and has room; otherwise it moves, through the
blob store, to an allowed runner able to restore its checkpoint, keeping its ID, files,
memory and processes, with that runner's address and endpoint host names ("moved from").
A frozen sandbox (runc) cannot move.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.ResumeWith(cmd.Context(), args[0], sandbox.ResumeOptions{RunnerIDs: runners})
			if err != nil {
				return err
			}
			if a.json() {
				m := map[string]any{"sandboxId": args[0]}
				if !res.Deadline.IsZero() {
					m["deadline"] = res.Deadline.UTC().Format(time.RFC3339Nano)
				}
				if res.RunnerID != "" {
					m["runnerId"] = res.RunnerID
				}
				if res.MovedFrom != "" {
					m["movedFrom"] = res.MovedFrom
				}
				return a.printJSON(m)
			}
			where := ""
			if res.RunnerID != "" {
				where = " on " + res.RunnerID
			}
			if res.MovedFrom != "" {
				where += " (moved from " + res.MovedFrom + ")"
			}
			until := ""
			if !res.Deadline.IsZero() {
				until = ", until " + res.Deadline.UTC().Format(time.RFC3339)
			}
			_, err = fmt.Fprintf(a.stdout, "%s running%s%s\n", args[0], where, until)
			return err
		},
	}
	cmd.Flags().StringArrayVar(&runners, "runner", nil, "a runner it may resume on (repeat; none: any)")
	return cmd
}

func (a *app) forkCommand() *cobra.Command {
	var (
		n         int
		requestID string
		runners   []string
	)
	cmd := &cobra.Command{
		Use:   "fork ID [-n N] [--request-id R] [--runner R]...",
		Short: "Make N copies of a running or paused sandbox",
		Long: fmt.Sprintf(`fork makes N (1..%d) new sandboxes from a running or paused one, each a copy of its
memory, processes and files with its own ID, address and endpoints; the source keeps
running after a short pause. It needs a runtime class that can be checkpointed (gvisor):
others are refused with CWSANDBOX_CHECKPOINT_NOT_SUPPORTED. The forks go to the source's
runner when it is allowed (--runner, repeated: the runners they may go to; none: any) and
has room; otherwise the source's checkpoint goes through the blob store to other allowed
runners able to restore it.

It prints the new sandboxes' IDs, one per line, each with its runner ("ID on RUNNER").
When some forks failed, it prints the others, then each failure on stderr, and exits 1. --request-id makes the fork
idempotent: the same request again returns the same forks.`, sandbox.MaxForks),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 || n > sandbox.MaxForks {
				return fmt.Errorf("-n %d: want 1..%d", n, sandbox.MaxForks)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			forks, err := c.Fork(cmd.Context(), args[0], n, sandbox.ForkOptions{RequestID: requestID, RunnerIDs: runners})
			var partial *sandbox.PartialForkError
			if err != nil && !errors.As(err, &partial) {
				return err
			}
			if a.json() {
				items := []map[string]any{}
				for _, sb := range forks {
					item := map[string]any{"sandboxId": sb.ID()}
					if r := sb.Info().RunnerID; r != "" {
						item["runnerId"] = r
					}
					items = append(items, item)
				}
				if partial != nil {
					for _, f := range partial.Failed {
						items = append(items, map[string]any{"sandboxId": f.ID, "error": map[string]string{
							"code": f.Err.Code.String(), "reason": f.Err.Reason, "message": f.Err.Message}})
					}
				}
				if jerr := a.printJSON(map[string]any{"forks": items}); jerr != nil {
					return jerr
				}
			} else {
				for _, sb := range forks {
					line := sb.ID()
					if r := sb.Info().RunnerID; r != "" {
						line += " on " + r
					}
					if _, werr := fmt.Fprintln(a.stdout, line); werr != nil {
						return werr
					}
				}
			}
			if partial != nil {
				for _, f := range partial.Failed {
					_, _ = fmt.Fprintf(a.stderr, "sbx: %s\n", f.Error())
				}
				return fmt.Errorf("%d of %d forks failed", len(partial.Failed), n)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, fmt.Sprintf("how many forks (1..%d)", sandbox.MaxForks))
	cmd.Flags().StringVar(&requestID, "request-id", "", "idempotency key: the same request again returns the same forks")
	cmd.Flags().StringArrayVar(&runners, "runner", nil, "a runner the forks may go to (repeat; none: any)")
	return cmd
}
