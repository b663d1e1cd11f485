package sbxcli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/textclip"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// longWait is how long one phase lasts before sbx says, without a terminal, what it
// waits for; again every longWaitAgain.
const (
	longWait      = 2 * time.Second
	longWaitAgain = 10 * time.Second
)

// startView renders a sandbox's start: on a terminal one updating line per phase
// (spinner, what it waits for, for a pull its layers, bytes and rate), the line of a
// finished pull kept; otherwise plain lines: a finished pull's summary, and what a
// phase waits for once it has lasted longWait (then every longWaitAgain).
type startView struct {
	w     io.Writer
	tty   bool
	id    string
	image string // what the spec runs, shown before the runner says more
	now   func() time.Time

	start      time.Time
	state      sandbox.State
	phase      sandbox.StartPhase
	waiting    string
	phaseStart time.Time
	pulls      []sandbox.ImagePull
	known      bool // a progress update came
	said       time.Time
	frame      int
	lineOpen   bool
	// rate: bytes of the pulls at the last sample, and the rate since.
	rateAt    time.Time
	rateBytes int64
	rate      float64 // bytes/s
	pullStart time.Time
	// summed: the images whose pull summary was printed (at most maxSummed).
	summed []string
}

// maxSummed bounds the pull summaries one start prints (the server sends at most 8 pulls).
const maxSummed = 16

func newStartView(w io.Writer, tty bool, id, image string, now func() time.Time) *startView {
	t := now()
	return &startView{w: w, tty: tty, id: shown(id), image: shown(image), now: now, start: t, phaseStart: t, state: sandbox.StateCreating}
}

// shown is text the server sent (an ID, an image name, what a phase waits for) as it
// may reach the terminal: bounded, and quoted and escaped when it holds anything not
// printable (a control sequence would otherwise drive the terminal).
func shown(s string) string { return cell(textclip.Clip(s, maxShown)) }

// maxShown bounds one server-sent string on the progress line.
const maxShown = 256

// setState takes a state from polling (a server without progress, or before its first
// update).
func (v *startView) setState(st sandbox.State) {
	if v.known || st == v.state {
		return
	}
	v.state = st
	v.draw()
}

// update takes a progress update.
func (v *startView) update(p sandbox.Progress) {
	now := v.now()
	p.WaitingFor = shown(p.WaitingFor)
	p.Pulls = slices.Clone(p.Pulls)
	for i := range p.Pulls {
		p.Pulls[i].Image = shown(p.Pulls[i].Image)
	}
	v.known, v.state = true, p.State
	if len(p.Pulls) > 0 {
		v.pulls = p.Pulls // the last word on a pull comes with the next phase
	}
	if p.Phase != v.phase {
		v.endPhase(now)
		v.phase, v.waiting, v.phaseStart, v.said = p.Phase, p.WaitingFor, now, time.Time{}
		if p.Phase == sandbox.PhasePullingImage {
			v.pullStart, v.rateAt, v.rateBytes, v.rate = now, now, 0, 0
		}
	}
	v.waiting = p.WaitingFor
	v.pulls = p.Pulls
	if v.phase != sandbox.PhasePullingImage {
		// A watch that began after the pull (a fast one) never sees the pulling phase:
		// the done pulls it is told about are summed up all the same.
		for _, pl := range p.Pulls {
			if pl.LayersTotal > 0 && pl.LayersDone == pl.LayersTotal {
				v.sumUp(pl, 0)
			}
		}
	}
	if b := pulledBytes(p.Pulls); v.phase == sandbox.PhasePullingImage && now.Sub(v.rateAt) >= time.Second {
		v.rate = float64(b-v.rateBytes) / now.Sub(v.rateAt).Seconds()
		v.rateAt, v.rateBytes = now, b
	}
	v.draw()
}

// endPhase closes the phase that ends: a pull's summary stays.
func (v *startView) endPhase(now time.Time) {
	if v.phase != sandbox.PhasePullingImage || len(v.pulls) == 0 {
		return
	}
	for _, p := range v.pulls {
		v.sumUp(p, now.Sub(v.pullStart))
	}
}

// sumUp prints pull p's summary once: its size and how long it took (the server's
// word, else seen, the time sbx watched it; unknown, no time).
func (v *startView) sumUp(p sandbox.ImagePull, seen time.Duration) {
	if slices.Contains(v.summed, p.Image) || len(v.summed) == maxSummed {
		return
	}
	v.summed = append(v.summed, p.Image)
	d := cmp.Or(p.Elapsed, seen)
	line := fmt.Sprintf("pulled image %s: %d %s, %s", p.Image, p.LayersTotal, plural(p.LayersTotal, "layer", "layers"), mb(p.BytesTotal))
	switch {
	case d >= time.Second:
		line += " in " + secs(d)
	case d > 0:
		line += fmt.Sprintf(" in %dms", max(d.Milliseconds(), 1))
	}
	if d >= 100*time.Millisecond && p.BytesTotal > 0 {
		line += fmt.Sprintf(" (%s/s)", mb(int64(float64(p.BytesTotal)/d.Seconds())))
	}
	v.println("sbx: sandbox " + v.id + ": " + line)
}

// tick redraws the terminal line (spinner, time) or, without a terminal, says what a
// long phase waits for.
func (v *startView) tick() {
	v.frame++
	if v.tty {
		v.draw()
		return
	}
	now := v.now()
	in := now.Sub(v.phaseStart)
	if in < longWait || (!v.said.IsZero() && now.Sub(v.said) < longWaitAgain) || v.phase == sandbox.PhaseRunning || v.phase == sandbox.PhaseEnded {
		return
	}
	v.said = now
	v.println("sbx: sandbox " + v.id + ": " + v.text(now) + " (" + secs(in) + ")")
}

// finish clears the terminal line.
func (v *startView) finish() {
	if v.phase == sandbox.PhasePullingImage {
		v.endPhase(v.now())
		v.phase = sandbox.PhaseUnspecified
	}
	if v.tty && v.lineOpen {
		_, _ = fmt.Fprint(v.w, "\r\033[K")
		v.lineOpen = false
	}
}

func (v *startView) draw() {
	if !v.tty {
		return
	}
	frames := []rune("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
	now := v.now()
	_, _ = fmt.Fprintf(v.w, "\r\033[K%c sandbox %s: %s %s", frames[v.frame%len(frames)], v.id, v.text(now), secs(now.Sub(v.start)))
	v.lineOpen = true
}

func (v *startView) println(s string) {
	if v.tty && v.lineOpen {
		_, _ = fmt.Fprint(v.w, "\r\033[K")
		v.lineOpen = false
	}
	_, _ = fmt.Fprintln(v.w, s)
}

// text is what the start does now.
func (v *startView) text(time.Time) string {
	if !v.known {
		return progressText(v.state, v.image)
	}
	switch v.phase {
	case sandbox.PhasePullingImage:
		if len(v.pulls) == 0 {
			return "pulling image " + v.image
		}
		var parts []string
		for _, p := range v.pulls {
			s := fmt.Sprintf("pulling image %s: layers %d/%d, %s/%s", p.Image, p.LayersDone, p.LayersTotal, mbNum(p.BytesDone), mb(p.BytesTotal))
			parts = append(parts, s)
		}
		s := strings.Join(parts, "; ")
		if v.rate > 0 {
			s += fmt.Sprintf(", %s/s", mb(int64(v.rate)))
		}
		return s
	case sandbox.PhaseRunning:
		return "running"
	case sandbox.PhaseEnded:
		return "ended"
	}
	if v.waiting != "" {
		return v.waiting
	}
	return progressText(v.state, v.image)
}

func pulledBytes(ps []sandbox.ImagePull) int64 {
	var n int64
	for _, p := range ps {
		n += p.BytesDone
	}
	return n
}

// mb is n bytes in MB (10^6), one decimal.
func mb(n int64) string { return mbNum(n) + " MB" }

func mbNum(n int64) string { return fmt.Sprintf("%.1f", float64(n)/1e6) }

func secs(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// waitWithProgress waits for sb to run. Unless the output is JSON it shows the start on
// stderr (startView), from the server's progress stream (WatchProgress) where it has
// one, else from the states polling sees.
func (a *app) waitWithProgress(ctx context.Context, sb *sandbox.Sandbox, image string) error {
	if a.json() || a.quiet {
		return sb.Wait(ctx)
	}
	v := newStartView(a.stderr, isTerminal(a.stderr), sb.ID(), image, time.Now)
	var mu sync.Mutex // guards v
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		_ = sb.WatchProgress(wctx, func(p sandbox.Progress) error {
			mu.Lock()
			v.update(p)
			mu.Unlock()
			return nil
		})
	}()
	ticked := make(chan struct{})
	go func() {
		defer close(ticked)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				mu.Lock()
				v.tick()
				mu.Unlock()
			}
		}
	}()
	err := sb.WaitProgress(ctx, func(in sandbox.Info) {
		mu.Lock()
		v.setState(in.State)
		mu.Unlock()
	})
	// The stream ends right after the sandbox runs: let its last update show.
	select {
	case <-watched:
	case <-time.After(2 * time.Second):
	}
	cancel()
	<-watched
	<-ticked
	mu.Lock()
	v.finish()
	mu.Unlock()
	return err
}
