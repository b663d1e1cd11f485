package sbxcli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func pulling(done, total int, bytes int64) sandbox.Progress {
	return sandbox.Progress{State: sandbox.StateCreating, Phase: sandbox.PhasePullingImage, WaitingFor: "pulling image",
		Pulls: []sandbox.ImagePull{{Image: "busybox", LayersDone: done, LayersTotal: total, BytesDone: bytes, BytesTotal: 2_000_000}}}
}

// Without a terminal: nothing while phases are short; what a phase waits for once it
// lasts 2 s (with the pull's layers and bytes), not again before 10 s; a finished pull's
// summary at the phase change; nothing for the start's other short phases.
func TestStartViewPlain(t *testing.T) {
	var buf bytes.Buffer
	c := &fakeClock{t: time.Unix(1000, 0)}
	v := newStartView(&buf, false, "sb-1", "busybox", c.now)
	v.update(pulling(0, 2, 0))
	c.add(time.Second)
	v.update(pulling(1, 2, 500_000))
	v.tick()
	if buf.Len() != 0 {
		t.Fatalf("a short phase said %q", buf.String())
	}
	c.add(1500 * time.Millisecond)
	v.tick()
	c.add(time.Second)
	v.tick() // said 1 s ago: not again
	c.add(500 * time.Millisecond)
	v.update(sandbox.Progress{State: sandbox.StateCreating, Phase: sandbox.PhaseStartingContainer, WaitingFor: "starting container",
		Pulls: []sandbox.ImagePull{{Image: "busybox", LayersDone: 2, LayersTotal: 2, BytesDone: 2_000_000, BytesTotal: 2_000_000}}})
	c.add(time.Second)
	v.tick()
	c.add(100 * time.Millisecond)
	v.update(sandbox.Progress{State: sandbox.StateRunning, Phase: sandbox.PhaseRunning})
	c.add(5 * time.Second)
	v.tick()
	v.finish()
	want := "sbx: sandbox sb-1: pulling image busybox: layers 1/2, 0.5/2.0 MB, 0.5 MB/s (2.5s)\n" +
		"sbx: sandbox sb-1: pulled image busybox: 2 layers, 2.0 MB in 4.0s (0.5 MB/s)\n"
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}
}

// A watch that begins after a fast pull never sees the pulling phase: the done pull's
// summary is printed all the same, once, with the time the server says it took; a pull
// not done (it failed) is not summed up outside its phase.
func TestStartViewLateWatchSumsUpDonePull(t *testing.T) {
	var buf bytes.Buffer
	c := &fakeClock{t: time.Unix(1000, 0)}
	v := newStartView(&buf, false, "sb-1", "busybox", c.now)
	done := sandbox.ImagePull{Image: "busybox", LayersDone: 2, LayersTotal: 2, BytesDone: 2_000_000, BytesTotal: 2_000_000, Elapsed: 400 * time.Millisecond}
	partial := sandbox.ImagePull{Image: "other", LayersDone: 1, LayersTotal: 2, BytesDone: 1_000, BytesTotal: 2_000}
	v.update(sandbox.Progress{State: sandbox.StateCreating, Phase: sandbox.PhaseStartingContainer, Pulls: []sandbox.ImagePull{done, partial}})
	c.add(50 * time.Millisecond)
	v.update(sandbox.Progress{State: sandbox.StateRunning, Phase: sandbox.PhaseRunning, Pulls: []sandbox.ImagePull{done, partial}})
	v.finish()
	want := "sbx: sandbox sb-1: pulled image busybox: 2 layers, 2.0 MB in 400ms (5.0 MB/s)\n"
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}

	// An older server says no time: the summary says none.
	buf.Reset()
	v = newStartView(&buf, false, "sb-2", "busybox", c.now)
	done.Elapsed = 0
	v.update(sandbox.Progress{State: sandbox.StateRunning, Phase: sandbox.PhaseRunning, Pulls: []sandbox.ImagePull{done}})
	v.finish()
	if want := "sbx: sandbox sb-2: pulled image busybox: 2 layers, 2.0 MB\n"; buf.String() != want {
		t.Errorf("got %q, want %q", buf.String(), want)
	}
}

// Long phases other than a pull say what they wait for; without any progress from the
// server, what the state tells.
func TestStartViewPlainWaits(t *testing.T) {
	var buf bytes.Buffer
	c := &fakeClock{t: time.Unix(1000, 0)}
	v := newStartView(&buf, false, "sb-1", "busybox", c.now)
	c.add(3 * time.Second)
	v.tick()
	v.update(sandbox.Progress{State: sandbox.StateCreating, Phase: sandbox.PhaseStartingCommand, WaitingFor: "waiting for the main command to start"})
	c.add(2 * time.Second)
	v.tick()
	want := "sbx: sandbox sb-1: pulling image busybox and starting… (3.0s)\n" +
		"sbx: sandbox sb-1: waiting for the main command to start (2.0s)\n"
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}
}

// On a terminal: one line redrawn in place (layers, bytes, rate), the finished pull's
// line kept, the line cleared at the end.
func TestStartViewTerminal(t *testing.T) {
	var buf bytes.Buffer
	c := &fakeClock{t: time.Unix(1000, 0)}
	v := newStartView(&buf, true, "sb-1", "busybox", c.now)
	v.update(pulling(0, 2, 0))
	c.add(time.Second)
	v.update(pulling(1, 2, 1_000_000))
	v.tick()
	c.add(time.Second)
	v.update(sandbox.Progress{State: sandbox.StateCreating, Phase: sandbox.PhaseStartingContainer, WaitingFor: "starting container",
		Pulls: []sandbox.ImagePull{{Image: "busybox", LayersDone: 2, LayersTotal: 2, BytesDone: 2_000_000, BytesTotal: 2_000_000}}})
	v.update(sandbox.Progress{State: sandbox.StateRunning, Phase: sandbox.PhaseRunning})
	v.finish()
	out := buf.String()
	for _, want := range []string{
		"\r\033[K⠋ sandbox sb-1: pulling image busybox: layers 0/2, 0.0/2.0 MB 0.0s",
		"sandbox sb-1: pulling image busybox: layers 1/2, 1.0/2.0 MB, 1.0 MB/s 1.0s",
		"\r\033[Ksbx: sandbox sb-1: pulled image busybox: 2 layers, 2.0 MB in 2.0s (1.0 MB/s)\n",
		"sandbox sb-1: starting container 2.0s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in %q", want, out)
		}
	}
	if !strings.HasSuffix(out, "\r\033[K") {
		t.Errorf("line not cleared at the end: %q", out)
	}
	if strings.Count(out, "\n") != 1 {
		t.Errorf("%d lines kept, want the pull's only: %q", strings.Count(out, "\n"), out)
	}
}

// WatchSandboxProgress plays the fake's progress updates for any sandbox it has;
// without updates it is not implemented, as on a server without the extension.
func (s *fakeState) WatchSandboxProgress(_ context.Context, req *connect.Request[statev1.WatchSandboxProgressRequest], st *connect.ServerStream[statev1.WatchSandboxProgressResponse]) error {
	f := s.f
	f.mu.Lock()
	updates := f.progress
	f.watches++
	f.mu.Unlock()
	if updates == nil {
		return connect.NewError(connect.CodeUnimplemented, nil)
	}
	if _, err := f.get(req.Msg.GetSandboxId()); err != nil {
		return err
	}
	for _, u := range updates {
		if err := st.Send(u); err != nil {
			return err
		}
	}
	return nil
}

// sbx run against a server with progress (a buffer, not a terminal): the pull's summary
// on stderr; with -q or -o json none, and with -o json progress is not even asked for.
func TestSbxRunShowsPull(t *testing.T) {
	f := newFake(t)
	f.progress = []*statev1.WatchSandboxProgressResponse{
		{State: "STATE_CREATING", Phase: statev1.StartPhase_START_PHASE_PULLING_IMAGE, WaitingFor: "pulling image",
			Pulls: []*statev1.ImagePull{{Image: "busybox", LayersDone: 0, LayersTotal: 3, BytesTotal: 3_000_000}}},
		{State: "STATE_CREATING", Phase: statev1.StartPhase_START_PHASE_STARTING_CONTAINER, WaitingFor: "starting container",
			Pulls: []*statev1.ImagePull{{Image: "busybox", LayersDone: 3, LayersTotal: 3, BytesDone: 3_000_000, BytesTotal: 3_000_000}}},
		{State: "STATE_RUNNING", Phase: statev1.StartPhase_START_PHASE_RUNNING},
	}
	_, errs, code := f.sbx("", "run", "--rm", "busybox", "--", "true")
	if code != 0 || !strings.HasPrefix(errs, "sbx: sandbox ") || !strings.Contains(errs, ": pulled image busybox: 3 layers, 3.0 MB in ") {
		t.Errorf("run: %d stderr %q, want the pull's summary", code, errs)
	}
	if _, errs, code := f.sbx("", "run", "-q", "--rm", "busybox", "--", "true"); code != 0 || errs != "" {
		t.Errorf("run -q: %d stderr %q", code, errs)
	}
	f.mu.Lock()
	before := f.watches
	f.mu.Unlock()
	if out, errs, code := f.sbx("", "-o", "json", "run", "busybox"); code != 0 || strings.Contains(errs, "pulled") || !strings.HasPrefix(out, "{") {
		t.Errorf("run -o json: %d %q %q", code, out, errs)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.watches != before {
		t.Errorf("-o json watched progress")
	}
}

// TestStartViewEscapes: what the server sends (the sandbox ID, an image name, what a
// phase waits for) reaches the terminal escaped, so a hostile server or image name
// cannot drive it with control sequences.
func TestStartViewEscapes(t *testing.T) {
	var buf bytes.Buffer
	c := &fakeClock{t: time.Unix(1000, 0)}
	evil := "img\x1b]0;owned\x07\x1b[2J"
	v := newStartView(&buf, true, "sb-\x1b[31m1", evil, c.now)
	v.update(sandbox.Progress{State: sandbox.StateCreating, Phase: sandbox.PhasePullingImage, WaitingFor: "pulling\x1b[1A",
		Pulls: []sandbox.ImagePull{{Image: evil, LayersTotal: 1, BytesTotal: 10}}})
	c.add(3 * time.Second)
	v.update(sandbox.Progress{State: sandbox.StateCreating, Phase: sandbox.PhaseStartingContainer, WaitingFor: "starting\x1b[1A" + strings.Repeat("x", 10_000)})
	v.tick()
	v.finish()
	out := strings.ReplaceAll(buf.String(), "\r\033[K", "") // the view's own line clearing
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Errorf("a control character reached the terminal: %q", out)
	}
	if !strings.Contains(out, `\x1b]0;owned\a`) {
		t.Errorf("the image name is not shown escaped: %q", out)
	}
	if len(out) > 4096 {
		t.Errorf("%d bytes written: a server string is not bounded", len(out))
	}
}
