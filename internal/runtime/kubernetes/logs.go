package kubernetes

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
)

// The agent keeps the main command's log in the Pod's emptyDir, which goes with the Pod.
// With Config.LogDir set, the backend follows each live sandbox's log from its agent into
// LogDir/<id>/ (the agent's own format, same offsets), so the runner can archive it when
// the sandbox ends (LogDir) and serve it afterwards, as with the local backend.

// shipLogs follows s's log until the main command has finally ended (the follow stream
// ends cleanly), the sandbox has ended, or the backend is closed.
func (b *Backend) shipLogs(s *sandbox) {
	defer close(s.logsDone)
	w, err := logstore.Open(b.logDir(s.id), agentconfig.MainLog)
	if err != nil {
		b.log.Warn("open sandbox log copy", "sandbox", s.id, "err", err)
		return
	}
	defer func() { _ = w.Close() }()
	client := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.DialAgent(ctx, s.id, "") })
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
		select {
		case <-s.done:
			return
		case <-b.ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (b *Backend) logDir(id string) string { return filepath.Join(b.cfg.LogDir, id) }

// LogDir returns the directory holding the copy of an ended sandbox's log (for the
// runner to archive), once the copy is complete or after 5 s; "" without Config.LogDir.
func (b *Backend) LogDir(id, container string) string {
	if b.cfg.LogDir == "" || !validID(id) {
		return ""
	}
	b.mu.Lock()
	s := b.sandboxes[id]
	b.mu.Unlock()
	if s != nil && s.logsDone != nil {
		select {
		case <-s.logsDone:
		case <-time.After(5 * time.Second):
		}
	}
	return b.logDir(id)
}

func (b *Backend) startLogs(s *sandbox) {
	if b.cfg.LogDir == "" {
		return
	}
	s.logsDone = make(chan struct{})
	go b.shipLogs(s)
}

func (b *Backend) removeLogs(id string) {
	if b.cfg.LogDir != "" {
		_ = os.RemoveAll(b.logDir(id))
	}
}
