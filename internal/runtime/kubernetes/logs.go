package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The agent keeps the main command's log in the Pod's emptyDir, which goes with the Pod.
// With Config.LogDir set, the backend follows each live sandbox's log from its agent into
// LogDir/<id>/ (the agent's own format, same offsets), so the runner can archive it when
// the sandbox ends (LogDir) and serve it afterwards, as with the local backend.

// shipLogs follows the log of s's container ("" = the primary) until its main command
// has finally ended (the follow stream ends cleanly), the sandbox has ended, or the
// backend is closed.
func (b *Backend) shipLogs(s *sandbox, container string, done chan struct{}) {
	defer close(done)
	w, err := logstore.Open(b.containerLogDir(s.id, container), agentconfig.MainLog)
	if err != nil {
		b.log.Warn("open sandbox log copy", "sandbox", s.id, "err", err)
		return
	}
	defer func() { _ = w.Close() }()
	client := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.DialAgent(ctx, s.id, container) })
	for {
		next := w.Size()
		stream, err := client.Logs(b.ctx, connect.NewRequest(&agentv1.LogsRequest{Follow: true, FromOffset: true, Offset: next}))
		if err == nil {
			for stream.Receive() {
				m := stream.Msg()
				if m.GetOffset() != next { // never expected: the agent's log only grows
					b.log.Warn("sandbox log copy: gap", "sandbox", s.id, "have", next, "got", m.GetOffset())
				}
				if _, err := w.Write(logstore.Stream(m.GetStream()), m.GetData()); err != nil {
					b.log.Warn("sandbox log copy", "sandbox", s.id, "err", err)
					_ = stream.Close()
					return
				}
				next = m.GetNextOffset()
			}
			err = stream.Err()
			_ = stream.Close()
			if err == nil {
				return // the main command has finally ended
			}
		}
		if b.pausedNow(s) {
			// Paused (checkpoint.go; DialAgent is ErrPaused): wait for the resume (or the
			// end), not a timer.
			for b.pausedNow(s) {
				b.mu.Lock()
				ch := s.changed
				b.mu.Unlock()
				if !b.pausedNow(s) {
					break
				}
				select {
				case <-ch:
				case <-s.done:
					return
				case <-b.ctx.Done():
					return
				}
			}
			continue
		}
		select {
		case <-s.done:
			return
		case <-b.ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pausedNow reports whether s is pausing or paused.
func (b *Backend) pausedNow(s *sandbox) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return s.pausing || s.paused != nil
}

func (b *Backend) logDir(id string) string { return filepath.Join(b.cfg.LogDir, id) }

// containersLogDir holds the log copies of a group's sidecars: LogDir/.containers/<id>/
// <name> (no sandbox ID starts with a dot).
func (b *Backend) containersLogDir(id string) string {
	return filepath.Join(b.cfg.LogDir, ".containers", id)
}

func (b *Backend) containerLogDir(id, container string) string {
	if container == "" {
		return b.logDir(id)
	}
	return filepath.Join(b.containersLogDir(id), container)
}

// LogDir returns the directory holding the copy of an ended sandbox's log (for the
// runner to archive), once the copy is complete or after 5 s; "" without Config.LogDir.
// container names a sidecar of a group ("" and the primary's name: the primary); init
// containers have no copy (their agents have ended before the gate serves).
func (b *Backend) LogDir(id, container string) string {
	if b.cfg.LogDir == "" || !validID(id) {
		return ""
	}
	b.mu.Lock()
	s := b.sandboxes[id]
	b.mu.Unlock()
	if s == nil {
		// No longer tracked (a teardown on the recovery path): a sidecar's copy is where
		// it would be, if the sandbox had one of that name; "" is the primary.
		switch {
		case container == "":
			return b.logDir(id)
		case !runtime.ValidContainerName(container):
			return ""
		}
		dir := b.containerLogDir(id, container)
		if _, err := os.Lstat(dir); err != nil && container == runtime.DefaultContainerName {
			return b.logDir(id) // the unnamed primary's name
		}
		return dir
	}
	key := ""
	if container != "" {
		c, init := s.spec.Find(container)
		switch {
		case c == nil || init:
			return ""
		case c != &s.spec.Container:
			key = container
		}
	}
	if done := s.logsDone[key]; done != nil {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
	return b.containerLogDir(id, key)
}

// OpenContainerLog opens the host copy of the log of a sidecar that exited while its
// sandbox runs (complete once its agent ended, or after LogDir's wait). The copy is
// written by this backend alone, never by the sandbox. Init containers have no copy
// (errors.ErrUnsupported: the runner says so), nor has any container without
// Config.LogDir.
func (b *Backend) OpenContainerLog(id, container string) (*logstore.Reader, error) {
	dir := b.LogDir(id, container)
	if dir == "" {
		return nil, fmt.Errorf("%w: no copy of the log of container %q of sandbox %s on this backend", errors.ErrUnsupported, container, id)
	}
	return logstore.OpenReader(dir, agentconfig.MainLog)
}

// startLogs starts copying the logs of s's primary and sidecars.
func (b *Backend) startLogs(s *sandbox) {
	if b.cfg.LogDir == "" {
		return
	}
	s.logsDone = map[string]chan struct{}{}
	for _, c := range s.spec.Containers() {
		key := ""
		if c != &s.spec.Container {
			key = c.ContainerName()
		}
		done := make(chan struct{})
		s.logsDone[key] = done
		go b.shipLogs(s, key, done)
	}
}

func (b *Backend) removeLogs(id string) {
	if b.cfg.LogDir != "" {
		_ = os.RemoveAll(b.logDir(id))
		_ = os.RemoveAll(b.containersLogDir(id))
	}
}
