package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

func collectLogs(t *testing.T, h *harness, req *agentv1.LogsRequest) ([]*agentv1.LogsResponse, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := h.client.Logs(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*agentv1.LogsResponse
	var b strings.Builder
	var next uint64
	for stream.Receive() {
		m := stream.Msg()
		if len(msgs) > 0 && m.Offset != next {
			t.Errorf("offset %d, want %d", m.Offset, next)
		}
		if m.NextOffset != m.Offset+uint64(len(m.Data)) || m.Time == nil {
			t.Errorf("bad message %v", m)
		}
		next = m.NextOffset
		msgs = append(msgs, m)
		b.Write(m.Data)
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("logs: %v", err)
	}
	return msgs, b.String()
}

func TestLogs(t *testing.T) {
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	script := `for i in 1 2 3 4 5; do echo line$i; done; echo err1 >&2; while [ ! -e gate ]; do sleep 0.02; done; echo late1; sleep 0.05; echo late2`
	h := startAgent(t, &agentconfig.Config{Argv: []string{"sh", "-c", script}, WorkingDir: dir})
	waitLog(t, h, "err1")

	_, all := collectLogs(t, h, &agentv1.LogsRequest{})
	if !sameLines(all, "line1\nline2\nline3\nline4\nline5\nerr1\n") {
		t.Fatalf("all = %q", all)
	}
	if _, got := collectLogs(t, h, &agentv1.LogsRequest{TailLines: 2}); !strings.HasSuffix(all, got) || strings.Count(got, "\n") != 2 {
		t.Errorf("tail 2 = %q", got)
	}
	if _, got := collectLogs(t, h, &agentv1.LogsRequest{TailLines: 100}); got != all {
		t.Errorf("tail 100 = %q", got)
	}
	if _, got := collectLogs(t, h, &agentv1.LogsRequest{Offset: 6, FromOffset: true}); got != all[6:] {
		t.Errorf("from offset 6 = %q", got)
	}
	if msgs, _ := collectLogs(t, h, &agentv1.LogsRequest{Offset: 6, FromOffset: true}); msgs[0].Offset != 6 {
		t.Errorf("first offset %d", msgs[0].Offset)
	}
	if _, got := collectLogs(t, h, &agentv1.LogsRequest{Since: timestamppb.New(time.Now().Add(time.Hour))}); got != "" {
		t.Errorf("since future = %q", got)
	}
	if _, got := collectLogs(t, h, &agentv1.LogsRequest{Since: timestamppb.New(time.Now().Add(-time.Hour))}); got != all {
		t.Errorf("since past = %q", got)
	}

	// Follow from the tail: receives lines written later and ends when main ends.
	done := make(chan string, 1)
	go func() {
		_, got := collectLogs(t, h, &agentv1.LogsRequest{Follow: true, TailLines: 1})
		done <- got
	}()
	time.Sleep(100 * time.Millisecond)
	os.WriteFile(gate, nil, 0o644)
	select {
	case got := <-done:
		if !strings.HasSuffix(got, "late1\nlate2\n") || strings.Count(got, "\n") != 3 {
			t.Errorf("follow = %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end with the main command")
	}
	if code := h.wait(t); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// TestLogsSince checks since against chunk times.
func TestLogsSince(t *testing.T) {
	h := startAgent(t, &agentconfig.Config{Argv: []string{"sh", "-c", "echo early; sleep 0.3; echo later; sleep 1000"}})
	waitLog(t, h, "later")
	msgs, _ := collectLogs(t, h, &agentv1.LogsRequest{})
	if len(msgs) != 2 {
		t.Fatalf("msgs = %v", msgs)
	}
	since := msgs[1].Time.AsTime().Add(-time.Millisecond)
	if _, got := collectLogs(t, h, &agentv1.LogsRequest{Since: timestamppb.New(since)}); got != "later\n" {
		t.Errorf("since = %q", got)
	}
}

// TestLogsKeepOrderAcrossStreams: stdout and stderr of the main command are one sequence
// in the log, in the order the command wrote them, with strictly increasing times.
func TestLogsKeepOrderAcrossStreams(t *testing.T) {
	script := `i=0; while [ $i -lt 200 ]; do i=$((i+1)); echo out$i; echo err$i >&2; done; echo one; echo two >&2; echo three; sleep 1000`
	h := startAgent(t, &agentconfig.Config{Argv: []string{"sh", "-c", script}})
	waitLog(t, h, "three\n")
	msgs, all := collectLogs(t, h, &agentv1.LogsRequest{})
	var want strings.Builder
	for i := 1; i <= 200; i++ {
		fmt.Fprintf(&want, "out%d\nerr%d\n", i, i)
	}
	want.WriteString("one\ntwo\nthree\n")
	if all != want.String() {
		t.Errorf("log out of order:\n%s", firstDiff(all, want.String()))
	}
	for i := 1; i < len(msgs); i++ {
		if !msgs[i].Time.AsTime().After(msgs[i-1].Time.AsTime()) {
			t.Errorf("chunk %d at %s, not after chunk %d at %s", i, msgs[i].Time.AsTime(), i-1, msgs[i-1].Time.AsTime())
		}
	}
}

// firstDiff shows where got and want part.
func firstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(0, i-20)
	return fmt.Sprintf("at byte %d: got %q, want %q", i, got[lo:min(len(got), i+20)], want[lo:min(len(want), i+20)])
}
