package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// TestRelistener: suspend closes the listener and the connections it accepted (and
// says so with SuspendedFile) without Accept returning; resume listens again with the
// identity the config file has now (a restored fork's), and Accept goes on serving.
func TestRelistener(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	cfgPath := filepath.Join(dir, "config.json")
	writeCfg := func(id agentconfig.Identity) {
		b, _ := json.Marshal(agentconfig.Config{Argv: []string{"true"}, Identity: &id})
		if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(identSecrets["a"])
	rl, err := newRelistener(sock, dir, cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	a := identSecrets["a"]
	ln, err := WithIdentity(rl, &a)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
			go func() { _, _ = io.Copy(io.Discard, c) }() // reads run the handshake
		}
	}()
	dial := func(want string) (net.Conn, error) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return nil, err
		}
		id := identSecrets[want]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := VerifyIdentity(ctx, c, &id); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	c1, err := dial("a")
	if err != nil {
		t.Fatal(err)
	}
	<-accepted
	if err := rl.suspend(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, SuspendedFile)); err != nil {
		t.Errorf("no %s after suspend: %v", SuspendedFile, err)
	}
	// The accepted connection is closed; no new one gets through.
	_ = c1.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c1.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read on a connection accepted before suspend: %v, want it closed", err)
	}
	if c, err := dial("a"); err == nil {
		c.Close()
		t.Fatal("dial while suspended succeeded")
	}
	// A fork's new identity, then resume.
	writeCfg(identSecrets["b"])
	if err := rl.resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, SuspendedFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left after resume: %v", SuspendedFile, err)
	}
	if c, err := dial("a"); err == nil {
		c.Close()
		t.Error("the old identity still answers after resume")
	}
	c2, err := dial("b")
	if err != nil {
		t.Fatalf("dial after resume: %v", err)
	}
	c2.Close()
	// ResumeFile (the backend's way after a restore) resumes it too, and is removed; a
	// stale one from before the suspend does not.
	if err := os.WriteFile(filepath.Join(dir, ResumeFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rl.suspend(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * resumePoll)
	if c, err := dial("b"); err == nil {
		c.Close()
		t.Fatal("a ResumeFile from before the suspend resumed the agent")
	}
	writeCfg(identSecrets["a"])
	if err := os.WriteFile(filepath.Join(dir, ResumeFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitDeadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dial("a")
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(waitDeadline) {
			t.Fatalf("not listening again after %s appeared: %v", ResumeFile, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, f := range []string{ResumeFile, SuspendedFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after the file resume: %v", f, err)
		}
	}
	writeCfg(identSecrets["b"])
	if err := rl.suspend(); err != nil {
		t.Fatal(err)
	}
	if err := rl.resume(); err != nil {
		t.Fatal(err)
	}
	// Suspended without resume: it listens again by itself after suspendMax.
	old := suspendMax
	suspendMax = 100 * time.Millisecond
	defer func() { suspendMax = old }()
	if err := rl.suspend(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dial("b")
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not listening again after suspendMax: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// socketFDs counts this process's open socket descriptors.
func socketFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && len(l) > 7 && l[:7] == "socket:" {
			n++
		}
	}
	return n
}

// idleRelistener is a relistener on dir/agent.sock (dir a fresh temporary directory, its
// state dir) whose identity file does not exist, closed when the test ends.
func idleRelistener(t *testing.T) (rl *relistener, dir, sock string) {
	t.Helper()
	dir = t.TempDir()
	sock = filepath.Join(dir, "agent.sock")
	rl, err := newRelistener(sock, dir, filepath.Join(dir, "none.json"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rl.Close() })
	return rl, dir, sock
}

// TestRelistenerSuspendClosesDescriptors: when suspend returns, the descriptors of the
// listener (an Accept in flight on it) and of an accepted connection (a Read in flight
// on it) are closed, not merely marked closed: runsc refuses to checkpoint a sandbox
// with a host-backed socket still open.
func TestRelistenerSuspendClosesDescriptors(t *testing.T) {
	rl, _, sock := idleRelistener(t)
	accepted := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := rl.Accept()
			if err != nil {
				return
			}
			accepted <- c
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	client, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	<-accepted
	time.Sleep(20 * time.Millisecond) // the Read and the next Accept are in flight
	before := socketFDs(t)            // listener, accepted conn, client
	if err := rl.suspend(); err != nil {
		t.Fatal(err)
	}
	if after := socketFDs(t); after > before-2 {
		t.Errorf("%d socket descriptors open after suspend, %d before: the listener's and the connection's are not both closed", after, before)
	}
	if err := rl.resume(); err != nil {
		t.Fatal(err)
	}
}

// TestRelistenerLateResumeSignal: ResumeSignal without ResumeFile (one sent before the
// suspend that arrives after it) leaves the agent suspended; with it, it resumes.
func TestRelistenerLateResumeSignal(t *testing.T) {
	rl, dir, sock := idleRelistener(t)
	rl.handleSignals(t.Logf)
	defer signal.Reset(SuspendSignal, ResumeSignal)
	listening := func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	waitState := func(want bool) bool {
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if listening() == want {
				return true
			}
		}
		return false
	}
	if err := syscall.Kill(os.Getpid(), SuspendSignal); err != nil {
		t.Fatal(err)
	}
	if !waitState(false) {
		t.Fatal("still listening after SuspendSignal")
	}
	if err := syscall.Kill(os.Getpid(), ResumeSignal); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if listening() {
		t.Fatal("a ResumeSignal without ResumeFile resumed the agent")
	}
	if err := os.WriteFile(filepath.Join(dir, ResumeFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), ResumeSignal); err != nil {
		t.Fatal(err)
	}
	if !waitState(true) {
		t.Fatal("not listening after ResumeFile and ResumeSignal")
	}
}

// TestRelistenerEndedSuspension: a resume bound to a suspension that has ended (its
// ResumeFile poll or suspendMax timer, delayed under load past the resume and the next
// suspend) leaves the next suspension alone: the agent stays without a listener until
// that suspension's own resume. Before, such a late poll listened again between the
// host's "suspended" and its `runsc checkpoint` ("Cannot save endpoint with bound host
// socket").
func TestRelistenerEndedSuspension(t *testing.T) {
	rl, dir, sock := idleRelistener(t)
	listening := func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	if err := rl.suspend(); err != nil {
		t.Fatal(err)
	}
	rl.mu.Lock()
	first := rl.wake
	rl.mu.Unlock()
	if err := rl.resume(); err != nil {
		t.Fatal(err)
	}
	if err := rl.suspend(); err != nil {
		t.Fatal(err)
	}
	if err := rl.resumeOf(first); err != nil {
		t.Fatal(err)
	}
	if listening() {
		t.Fatal("a resume of the ended suspension listened again during the next one")
	}
	if _, err := os.Stat(filepath.Join(dir, SuspendedFile)); err != nil {
		t.Errorf("%s gone during the suspension: %v", SuspendedFile, err)
	}
	rl.mu.Lock()
	second := rl.wake
	rl.mu.Unlock()
	if err := rl.resumeOf(second); err != nil {
		t.Fatal(err)
	}
	if !listening() {
		t.Fatal("the suspension's own resume did not listen again")
	}
}

// TestRelistenerSuspendDuringAccept: a connection accepted just before a suspend (not
// yet tracked) is closed before the suspend returns — the host checkpoints right after,
// and runsc cannot save a host-backed socket still open.
func TestRelistenerSuspendDuringAccept(t *testing.T) {
	rl, _, sock := idleRelistener(t)
	inGap := make(chan struct{})
	var once sync.Once
	rl.afterAccept = func() {
		once.Do(func() {
			close(inGap)
			time.Sleep(200 * time.Millisecond) // the suspend runs meanwhile
		})
	}
	go func() {
		for {
			c, err := rl.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	client, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	<-inGap
	if err := rl.suspend(); err != nil {
		t.Fatal(err)
	}
	// The agent's end is closed by now: the client reads EOF at once.
	_ = client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the connection accepted during the suspend is still open when it returns: read %d, %v", n, err)
	}
}

// TestRelistenerSuspendAwaitsFork: a child being forked when the agent suspends holds a
// copy of the listener's descriptor until its exec (runsc then refuses the checkpoint:
// "bound host socket"), so suspend creates SuspendedFile and returns only once the forks
// under way are done (the reaper's lock, which forkExec holds across ForkExec, is free),
// or after forkDrain when one does not end.
func TestRelistenerSuspendAwaitsFork(t *testing.T) {
	rl, dir, _ := idleRelistener(t)
	forks := &reaper{waiters: map[int]chan syscall.WaitStatus{}}
	rl.forks = forks
	waiting := make(chan struct{}, 1)
	forks.awaiting = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	defer func(d time.Duration) { forkDrain = d }(forkDrain)
	flag := filepath.Join(dir, SuspendedFile)
	suspend := func() chan error {
		done := make(chan error, 1)
		go func() { done <- rl.suspend() }()
		return done
	}

	forkDrain = time.Hour
	forks.mu.Lock() // a fork under way
	done := suspend()
	select {
	case <-waiting:
	case err := <-done:
		forks.mu.Unlock()
		t.Fatalf("suspend returned (%v) while a fork was under way", err)
	}
	// suspend waits for the lock (or an hour) from here on.
	if _, err := os.Stat(flag); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s made while a fork was under way (stat: %v)", SuspendedFile, err)
	}
	forks.mu.Unlock() // its exec is done
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(flag); err != nil {
		t.Fatalf("no %s once the fork was done: %v", SuspendedFile, err)
	}
	if err := rl.resume(); err != nil {
		t.Fatal(err)
	}

	// A fork that does not end delays the suspend by forkDrain only, and says so.
	var warned []any
	rl.warn = func(_ string, args ...any) { warned = args }
	forkDrain = time.Millisecond
	forks.mu.Lock()
	defer forks.mu.Unlock()
	select {
	case err := <-suspend():
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("suspend still waits for a fork long after forkDrain")
	}
	if _, err := os.Stat(flag); err != nil {
		t.Fatalf("no %s after forkDrain: %v", SuspendedFile, err)
	}
	if fmt.Sprint(warned) != "[calls_done true forks_done false]" {
		t.Errorf("warned %v, want the forks' wait reported as run out", warned)
	}
}
