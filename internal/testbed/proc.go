package testbed

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one process of the bed. It can be killed and started again with the same
// command line (a restarted runner keeps its data dir and so its identity).
type Proc struct {
	Name string
	// Addr is where it listens, as read from its start-up line; a restart listens there
	// again.
	Addr string

	argv    []string
	ready   string                       // prefix of the stdout line that says it is up
	restart func(argv []string) []string // command line for a restart (nil: the same)
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// start runs the process and waits (up to a minute) for its ready line, whose remainder
// becomes Addr when Addr is empty.
func (p *Proc) start(ctx context.Context) error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, _ = fmt.Fprintf(logf, "==== %s start: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.argv, " "))
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return err
	}
	// Its own process group, so a terminal's ^C reaches the bed and not each process.
	// No Pdeathsig: it fires when the forking OS thread ends, which Go may do anytime.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()

	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			_, _ = fmt.Fprintln(logf, line)
			if rest, ok := strings.CutPrefix(line, p.ready); ok {
				select {
				case found <- firstField(rest): // the address, without what follows
				default:
				}
			}
		}
		_, _ = io.Copy(logf, out)
		_ = cmd.Wait()
		_, _ = fmt.Fprintf(logf, "==== %s exited: %v\n", time.Now().Format(time.RFC3339Nano), cmd.ProcessState)
		logf.Close()
		close(exited)
	}()
	select {
	case rest := <-found:
		if p.Addr == "" {
			p.Addr = rest
		}
		return nil
	case <-exited:
		return fmt.Errorf("%s exited during start-up (log: %s)", p.Name, p.logPath)
	case <-time.After(time.Minute):
		p.Kill()
		return fmt.Errorf("%s not ready after a minute (log: %s)", p.Name, p.logPath)
	case <-ctx.Done():
		p.Kill()
		return ctx.Err()
	}
}

// Kill sends SIGKILL (kill -9) and waits for the process to exit.
func (p *Proc) Kill() {
	p.signal(syscall.SIGKILL)
}

// Stop sends SIGTERM and waits up to 30 s, then kills.
func (p *Proc) Stop() {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return
	}
	p.signalOnly(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		p.Kill()
	}
}

// Restart starts the process again after Kill or Stop.
func (p *Proc) Restart(ctx context.Context) error {
	if p.Running() {
		return errors.New(p.Name + " is still running")
	}
	if p.restart != nil {
		p.argv = p.restart(p.argv)
		p.restart = nil
	}
	return p.start(ctx)
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Log is the path of the process's log (stdout and stderr, across restarts).
func (p *Proc) Log() string { return p.logPath }

func (p *Proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return
	}
	p.signalOnly(sig)
	<-exited
}

func (p *Proc) signalOnly(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return ""
}
