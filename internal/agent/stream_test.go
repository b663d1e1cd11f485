package agent

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
)

type streamResult struct {
	stdout strings.Builder
	stderr strings.Builder
	errs   []*agentv1.StreamError
	exit   *agentv1.Exit
	last   *agentv1.StreamExecResponse
}

func sendInit(t *testing.T, s *connect.BidiStreamForClient[agentv1.StreamExecRequest, agentv1.StreamExecResponse], init *agentv1.StreamExecInit) {
	t.Helper()
	if err := s.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Init{Init: init}}); err != nil {
		t.Fatal(err)
	}
}

func recvReady(t *testing.T, s *connect.BidiStreamForClient[agentv1.StreamExecRequest, agentv1.StreamExecResponse]) int32 {
	t.Helper()
	r, err := s.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if r.GetReady() == nil || r.GetReady().Pid == 0 {
		t.Fatalf("first response %v, want ready", r)
	}
	return r.GetReady().Pid
}

// recvUntil reads until until returns true or the exit arrives.
func recvUntil(t *testing.T, s *connect.BidiStreamForClient[agentv1.StreamExecRequest, agentv1.StreamExecResponse], res *streamResult, until func() bool) {
	t.Helper()
	for res.exit == nil && (until == nil || !until()) {
		r, err := s.Receive()
		if err != nil {
			t.Fatalf("receive: %v (so far %q)", err, res.stdout.String())
		}
		res.last = r
		switch m := r.Message.(type) {
		case *agentv1.StreamExecResponse_Output:
			if m.Output.Stream == agentv1.Stream_STREAM_STDERR {
				res.stderr.Write(m.Output.Data)
			} else {
				res.stdout.Write(m.Output.Data)
			}
		case *agentv1.StreamExecResponse_Error:
			res.errs = append(res.errs, m.Error)
		case *agentv1.StreamExecResponse_Exit:
			res.exit = m.Exit
		}
	}
}

func stdin(b string) *agentv1.StreamExecRequest {
	return &agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Stdin{Stdin: []byte(b)}}
}

var closeReq = &agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Close{Close: &agentv1.CloseStdin{}}}

func TestStreamExecStdinHalfClose(t *testing.T) {
	h := startAgent(t, longMain())
	s := h.client.StreamExec(context.Background())
	sendInit(t, s, &agentv1.StreamExecInit{Command: []string{"sh", "-c", "cat; echo done >&2; exit 3"}})
	recvReady(t, s)
	var res streamResult
	for _, chunk := range []string{"one\n", "two\n", "three\n"} {
		if err := s.Send(stdin(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	recvUntil(t, s, &res, func() bool { return res.stdout.String() == "one\ntwo\nthree\n" })
	if res.exit != nil {
		t.Fatal("exited before stdin was closed")
	}
	if err := s.Send(closeReq); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, s, &res, nil)
	if res.exit.ExitCode != 3 || res.stderr.String() != "done\n" || res.stdout.String() != "one\ntwo\nthree\n" {
		t.Errorf("exit %v stdout %q stderr %q", res.exit, res.stdout.String(), res.stderr.String())
	}
	if _, err := s.Receive(); err == nil {
		t.Error("a message after exit")
	}
}

func TestStreamExecRequestEOFIsStdinEOF(t *testing.T) {
	h := startAgent(t, longMain())
	s := h.client.StreamExec(context.Background())
	sendInit(t, s, &agentv1.StreamExecInit{Command: []string{"wc", "-c"}})
	recvReady(t, s)
	s.Send(stdin("12345"))
	s.CloseRequest()
	var res streamResult
	recvUntil(t, s, &res, nil)
	if strings.TrimSpace(res.stdout.String()) != "5" || res.exit.ExitCode != 0 {
		t.Errorf("stdout %q exit %v", res.stdout.String(), res.exit)
	}
}

func TestStreamExecTTY(t *testing.T) {
	h := startAgent(t, longMain())
	s := h.client.StreamExec(context.Background())
	sendInit(t, s, &agentv1.StreamExecInit{
		Command: []string{"sh", "-c", `tty; stty size; echo $TERM; read line; stty size; echo "got $line"`},
		Tty:     true, TtyWidth: 100, TtyHeight: 30,
	})
	recvReady(t, s)
	var res streamResult
	recvUntil(t, s, &res, func() bool { return strings.Contains(res.stdout.String(), "xterm") })
	if err := s.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Resize{Resize: &agentv1.Resize{Width: 120, Height: 40}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the resize message is handled before the next stdin anyway
	s.Send(stdin("hello\n"))
	recvUntil(t, s, &res, nil)
	out := strings.ReplaceAll(res.stdout.String(), "\r\n", "\n")
	if !regexp.MustCompile(`^/dev/pts/\d+\n30 100\nxterm\nhello\n40 120\ngot hello\n$`).MatchString(out) {
		t.Errorf("tty output %q", out)
	}
	if res.exit.ExitCode != 0 || res.stderr.Len() != 0 {
		t.Errorf("exit %v stderr %q", res.exit, res.stderr.String())
	}
}

func TestStreamExecTTYClose(t *testing.T) {
	h := startAgent(t, longMain())
	s := h.client.StreamExec(context.Background())
	sendInit(t, s, &agentv1.StreamExecInit{Command: []string{"cat"}, Tty: true})
	recvReady(t, s)
	s.Send(closeReq) // VEOF at the start of a line: cat sees EOF
	var res streamResult
	recvUntil(t, s, &res, nil)
	if res.exit.ExitCode != 0 {
		t.Errorf("exit %v", res.exit)
	}
}

func TestStreamExecErrors(t *testing.T) {
	h := startAgent(t, longMain())
	t.Run("first not init", func(t *testing.T) {
		s := h.client.StreamExec(context.Background())
		s.Send(stdin("x"))
		if _, err := s.Receive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("start failed", func(t *testing.T) {
		s := h.client.StreamExec(context.Background())
		sendInit(t, s, &agentv1.StreamExecInit{Command: []string{"no-such-cmd"}})
		var res streamResult
		recvUntil(t, s, &res, nil)
		if len(res.errs) != 1 || res.errs[0].Code != StreamErrStartFailed || res.exit.ExitCode != 127 {
			t.Errorf("errs %v exit %v", res.errs, res.exit)
		}
	})
}

func TestStreamExecClientCancelKills(t *testing.T) {
	h := startAgent(t, longMain())
	ctx, cancel := context.WithCancel(context.Background())
	s := h.client.StreamExec(ctx)
	sendInit(t, s, &agentv1.StreamExecInit{Command: []string{"sh", "-c", "sleep 60 & sleep 60"}})
	pid := recvReady(t, s)
	cancel()
	waitGone(t, itoa32(pid))
	// The agent is still fine.
	res, err := h.client.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}}))
	if err != nil || res.Msg.ExitCode != 0 {
		t.Fatal(res, err)
	}
	// No sleep children left: the whole group was killed.
	deadline := time.Now().Add(3 * time.Second)
	for len(children(t, "sleep")) > 1 { // the main command is a sleep
		if time.Now().After(deadline) {
			t.Fatalf("children left: %v", children(t, "sleep"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStreamExecBackpressure(t *testing.T) {
	h := startAgent(t, longMain(), func(o *Options) { o.StreamStall = time.Second })
	s := h.client.StreamExec(context.Background())
	// Incompressible output, so no transport can hide it.
	sendInit(t, s, &agentv1.StreamExecInit{Command: []string{"cat", "/dev/urandom"}})
	recvReady(t, s)
	time.Sleep(2500 * time.Millisecond) // read nothing for longer than the stall: output piles up
	var res streamResult
	recvUntil(t, s, &res, nil)
	if len(res.errs) != 1 || res.errs[0].Code != StreamErrBackpressure {
		t.Errorf("errors %v", res.errs)
	}
	if res.exit.ExitCode != 137 || res.last.GetExit() == nil {
		t.Errorf("exit %v last %v", res.exit, res.last)
	}
}

func itoa32(i int32) string { return strconv.Itoa(int(i)) }

// TestStreamExecFastProducer: output much larger than the buffer reaches a client that
// keeps reading, however fast the command writes: the command waits, nothing fails.
func TestStreamExecFastProducer(t *testing.T) {
	h := startAgent(t, longMain())
	s := h.client.StreamExec(context.Background())
	const n = 40 << 20
	sendInit(t, s, &agentv1.StreamExecInit{Command: []string{"head", "-c", strconv.Itoa(n), "/dev/zero"}})
	recvReady(t, s)
	got := 0
	for {
		r, err := s.Receive()
		if err != nil {
			t.Fatalf("receive after %d bytes: %v", got, err)
		}
		if e := r.GetError(); e != nil {
			t.Fatalf("stream error after %d bytes: %s %s", got, e.Code, e.Message)
		}
		got += len(r.GetOutput().GetData())
		if x := r.GetExit(); x != nil {
			if x.ExitCode != 0 || got != n {
				t.Errorf("exit %d after %d bytes, want 0 after %d", x.ExitCode, got, n)
			}
			return
		}
	}
}
