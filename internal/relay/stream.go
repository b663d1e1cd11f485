package relay

import (
	"bytes"
	"errors"
	"io"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
)

// upstreamErr prefers the agent's own error over a local send failure.
func upstreamErr(up *connect.BidiStreamForClient[agentv1.StreamExecRequest, agentv1.StreamExecResponse], err error) error {
	if _, rerr := up.Receive(); rerr != nil && !errors.Is(rerr, io.EOF) {
		return rerr
	}
	return err
}

// logSessionPrefix makes a log session ID from a sandbox ID: one session per sandbox,
// since the agent keeps one log from the first start on.
const logSessionPrefix = "logs-"

// lineStamper prefixes every line with its ISO-8601 time and a space, remembering across
// chunks whether the next byte starts a line.
type lineStamper struct{ midLine bool }

func (l *lineStamper) stamp(data []byte, t time.Time) []byte {
	prefix := []byte(t.UTC().Format(time.RFC3339Nano) + " ")
	var b bytes.Buffer
	for len(data) > 0 {
		if !l.midLine {
			b.Write(prefix)
		}
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			b.Write(data)
			l.midLine = true
			break
		}
		b.Write(data[:i+1])
		data = data[i+1:]
		l.midLine = false
	}
	return b.Bytes()
}
