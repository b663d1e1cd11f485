package agent

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// The identity handshake. Every connection to an agent starts with it, before any HTTP:
// the backend sends a fresh nonce, the agent answers with the sandbox ID it was created
// for and an HMAC of nonce and ID under the per-sandbox secret the backend handed it at
// creation (agentconfig.Identity). The backend checks both against what it recorded for
// the sandbox it meant to reach, so a connection that ends up at another sandbox's agent
// — a path swapped by the sandbox, a mix-up in the backend — fails closed, loudly,
// instead of running one tenant's calls in another tenant's sandbox.
//
// The secret is readable inside its own sandbox (the config is): it proves nothing to
// the sandbox's own code, and need not. What it proves is that the agent answering is
// the one of the sandbox the backend meant, which no other sandbox's agent can fake.
//
//	backend → agent: "SBXI1" nonce[32]
//	agent → backend: "SBXI1" len[1] id[len] mac[32]   mac = HMAC-SHA256(secret, label ‖ nonce ‖ id)

var identityMagic = []byte("SBXI1")

const (
	identityLabel   = "sandboxd agent identity v1\x00"
	nonceLen        = 32
	macLen          = sha256.Size
	identityTimeout = 10 * time.Second
)

// ErrIdentity is a connection that reached an agent other than the one expected, or
// something that is no agent.
var ErrIdentity = errors.New("agent identity mismatch")

// NewIdentity returns a fresh identity for sandbox (container) id.
func NewIdentity(id string) *agentconfig.Identity {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return &agentconfig.Identity{ID: id, Secret: hex.EncodeToString(b)}
}

func identityMAC(secret, nonce []byte, id string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(identityLabel))
	m.Write(nonce)
	m.Write([]byte(id))
	return m.Sum(nil)
}

// VerifyIdentity runs the backend's side of the handshake on a new connection c: it
// returns nil when the agent that answers is want's, ErrIdentity (wrapped, naming both)
// when it is another, or an I/O error. c's deadline is reset afterwards.
func VerifyIdentity(ctx context.Context, c net.Conn, want *agentconfig.Identity) error {
	secret, err := hex.DecodeString(want.Secret)
	if err != nil || len(secret) == 0 {
		return fmt.Errorf("%w: no valid secret recorded for %s", ErrIdentity, want.ID)
	}
	deadline := time.Now().Add(identityTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.SetDeadline(deadline)
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()

	hello := make([]byte, 0, len(identityMagic)+nonceLen)
	hello = append(hello, identityMagic...)
	nonce := make([]byte, nonceLen)
	_, _ = rand.Read(nonce)
	hello = append(hello, nonce...)
	if _, err := c.Write(hello); err != nil {
		return fmt.Errorf("agent identity: %w", err)
	}
	head := make([]byte, len(identityMagic)+1)
	if _, err := io.ReadFull(c, head); err != nil {
		return fmt.Errorf("agent identity of %s: %w", want.ID, err)
	}
	if !bytes.Equal(head[:len(identityMagic)], identityMagic) {
		return fmt.Errorf("%w: the peer reached for %s does not speak the agent protocol", ErrIdentity, want.ID)
	}
	rest := make([]byte, int(head[len(identityMagic)])+macLen)
	if _, err := io.ReadFull(c, rest); err != nil {
		return fmt.Errorf("agent identity of %s: %w", want.ID, err)
	}
	got, mac := string(rest[:len(rest)-macLen]), rest[len(rest)-macLen:]
	if got != want.ID {
		return fmt.Errorf("%w: reached the agent of %q, want %q", ErrIdentity, got, want.ID)
	}
	if !hmac.Equal(mac, identityMAC(secret, nonce, want.ID)) {
		return fmt.Errorf("%w: the agent reached for %s does not hold its secret", ErrIdentity, want.ID)
	}
	return nil
}

// identityListener answers the handshake on every accepted connection, in the
// connection's own first Read or Write (so one slow peer never holds up Accept).
type identityListener struct {
	net.Listener
	mu     sync.RWMutex // id and secret change when a fork is restored (relisten.go)
	id     *agentconfig.Identity
	secret []byte
}

func parseIdentity(id *agentconfig.Identity) ([]byte, error) {
	secret, err := hex.DecodeString(id.Secret)
	if err != nil || len(secret) == 0 || len(id.ID) == 0 || len(id.ID) > 255 {
		return nil, errors.New("agent: identity: need an ID of 1-255 bytes and a hex secret")
	}
	return secret, nil
}

// setIdentity replaces the identity new connections prove.
func (l *identityListener) setIdentity(id *agentconfig.Identity) error {
	secret, err := parseIdentity(id)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.id, l.secret = id, secret
	l.mu.Unlock()
	return nil
}

func (l *identityListener) current() (string, []byte) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.id.ID, l.secret
}

// WithIdentity wraps ln so that its connections start with the identity handshake. With
// a nil identity ln is returned as is (agents of backends that hand out none).
func WithIdentity(ln net.Listener, id *agentconfig.Identity) (net.Listener, error) {
	if id == nil {
		return ln, nil
	}
	secret, err := parseIdentity(id)
	if err != nil {
		return nil, err
	}
	il := &identityListener{Listener: ln, id: id, secret: secret}
	if rl, ok := ln.(*relistener); ok {
		rl.idl = il
	}
	return il, nil
}

func (l *identityListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &identityConn{Conn: c, l: l}, nil
}

type identityConn struct {
	net.Conn
	l    *identityListener
	once sync.Once
	err  error
}

func (c *identityConn) handshake() error {
	c.once.Do(func() {
		_ = c.Conn.SetDeadline(time.Now().Add(identityTimeout))
		hello := make([]byte, len(identityMagic)+nonceLen)
		if _, err := io.ReadFull(c.Conn, hello); err != nil {
			c.err = fmt.Errorf("identity handshake: %w", err)
			return
		}
		if !bytes.Equal(hello[:len(identityMagic)], identityMagic) {
			c.err = errors.New("identity handshake: not a sandboxd backend")
			return
		}
		id, secret := c.l.current()
		out := make([]byte, 0, len(identityMagic)+1+len(id)+macLen)
		out = append(out, identityMagic...)
		out = append(out, byte(len(id)))
		out = append(out, id...)
		out = append(out, identityMAC(secret, hello[len(identityMagic):], id)...)
		if _, err := c.Conn.Write(out); err != nil {
			c.err = fmt.Errorf("identity handshake: %w", err)
			return
		}
		_ = c.Conn.SetDeadline(time.Time{})
	})
	return c.err
}

func (c *identityConn) Read(p []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *identityConn) Write(p []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}
