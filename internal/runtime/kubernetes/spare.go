package kubernetes

import (
	"context"
	"errors"
	"net"
	"time"
)

// A sandbox's spare: one verified connection to its primary agent (TLS with the pinned
// certificates, then the agent's identity), kept for its first agent client (dialAgent),
// so the way to its first command makes no new dial nor handshake. verifiedSpare is the
// one place that makes it, for both ways a sandbox gets one: its create's ping (the kept
// connection is the ping's answer) and a warm claim (claimSpare: begun beside the claim,
// kept only when the claim succeeds).

// spareTTL is how long a kept verified connection waits to be taken (dialAgent) before
// it is closed: a sandbox's first agent client comes within milliseconds of its Create.
const spareTTL = 10 * time.Second

// spareConn is a verified connection to a sandbox's primary agent at ip.
type spareConn struct {
	conn net.Conn
	ip   string
}

// errNoIdentity: a sandbox without an agent identity gets no spare (only a connection
// that passed the identity check is verified).
var errNoIdentity = errors.New("no agent identity recorded: no verified connection")

// verifiedSpare dials s's primary agent through the gate at ip, verifies it (dialGate)
// and keeps it as s's spare (keepSpare). hold, when not nil, defers the keeping until it
// says: true keeps, false closes. An error is errNoIdentity (s has no agent identity:
// no dial; the one place that checks it, for both callers), the dial's or the
// verification's.
func (b *Backend) verifiedSpare(ctx context.Context, s *sandbox, ip string, hold <-chan bool) error {
	if s.ident == nil {
		return errNoIdentity
	}
	c, err := b.dialGate(ctx, s, ip, "")
	if err != nil {
		return err
	}
	if hold != nil && !<-hold {
		_ = c.Close()
		return nil
	}
	b.keepSpare(s, ip, c)
	return nil
}

// keepSpare keeps c, a verified connection to s's primary agent at ip, for the first
// dialAgent (replacing one kept before); it is closed if nobody takes it within
// spareTTL, or at once when s has ended.
func (b *Backend) keepSpare(s *sandbox, ip string, c net.Conn) {
	sp := &spareConn{conn: c, ip: ip}
	b.mu.Lock()
	select {
	case <-s.done: // ended (or destroyed) meanwhile: nobody will take it
		b.mu.Unlock()
		_ = c.Close()
		return
	default:
	}
	old := s.spare
	s.spare = sp
	b.mu.Unlock()
	if old != nil {
		_ = old.conn.Close()
	}
	time.AfterFunc(spareTTL, func() {
		b.mu.Lock()
		mine := s.spare == sp
		if mine {
			s.spare = nil
		}
		b.mu.Unlock()
		if mine {
			_ = c.Close()
		}
	})
}

// dropSpareLocked closes s's kept connection, if any (its sandbox ended or goes); b.mu
// held.
func dropSpareLocked(s *sandbox) {
	if sp := s.spare; sp != nil {
		s.spare = nil
		go sp.conn.Close() // a TLS close writes: not under the lock
	}
}

// takeSpare returns s's kept verified connection to its primary agent at ip (nil: none;
// a connection to another IP is closed).
func (b *Backend) takeSpare(s *sandbox, ip string) net.Conn {
	b.mu.Lock()
	sp := s.spare
	s.spare = nil
	b.mu.Unlock()
	if sp == nil {
		return nil
	}
	if sp.ip != ip {
		_ = sp.conn.Close()
		return nil
	}
	return sp.conn
}

// warmSpareWait bounds how long a claim waits, after its Start, for the spare's dial
// (begun with the claim: done by then unless the gate is slow).
const warmSpareWait = time.Second

// pendingSpare is a warm claim's spare in the making (verifiedSpare with a hold): kept
// if the claim succeeds (keep), closed if it fails (drop).
type pendingSpare struct {
	hold chan<- bool     // nil: no dial, or keep or drop said already
	done <-chan struct{} // closed when verifiedSpare returned
}

// claimSpare begins s's spare at ip beside a warm claim (nothing without an IP; no dial
// without an agent identity: verifiedSpare). Its dial is not bound to the claim's ctx
// beyond its values: a claim that succeeds hands it over even when the claim's caller is
// gone by then.
func (b *Backend) claimSpare(ctx context.Context, s *sandbox, ip string) *pendingSpare {
	if ip == "" {
		return &pendingSpare{}
	}
	hold, done := make(chan bool, 1), make(chan struct{})
	go func() {
		defer close(done)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := b.verifiedSpare(dctx, s, ip, hold); err != nil {
			b.log.Debug("warm claim: no verified connection to hand over", "sandbox", s.id, "err", err)
		}
	}()
	return &pendingSpare{hold: hold, done: done}
}

// keep hands the connection over as the sandbox's spare, waiting for it at most
// warmSpareWait; a later one is handed over when it comes.
func (sp *pendingSpare) keep() {
	if sp.hold == nil {
		return
	}
	sp.hold <- true
	sp.hold = nil
	t := time.NewTimer(warmSpareWait)
	defer t.Stop()
	select {
	case <-sp.done:
	case <-t.C:
	}
}

// drop closes the connection of a claim that failed (nothing after keep).
func (sp *pendingSpare) drop() {
	if sp.hold == nil {
		return
	}
	sp.hold <- false
	sp.hold = nil
}
