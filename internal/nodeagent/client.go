package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	nodeagentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1/nodeagentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
)

// CheckpointRequest asks an agent to checkpoint the gVisor Pod sandbox of a Pod.
type CheckpointRequest struct {
	Namespace, Name, UID string
	// SandboxID is the sandboxd sandbox the Pod must be (its sandboxd.io/sandbox-id label).
	SandboxID string
	// LeaveRunning: the sandbox runs on (a fork); false: its containers end (a pause).
	LeaveRunning bool
}

// CheckpointResult is a checkpoint made.
type CheckpointResult struct {
	ID, Node string
	Bytes    int64
	Took     time.Duration
	// SandboxRunning: whether a container of the Pod sandbox still runs; nil: unknown
	// (the agent could not tell, or with an error, the sandbox was never touched). With an
	// error: whether the sandbox survived the failed checkpoint.
	SandboxRunning *bool
}

// Client is a runner's client of one node agent. Errors are *connect.Error (connect.CodeOf).
type Client struct {
	hc  *http.Client
	api nodeagentv1connect.NodeAgentServiceClient
}

// MaxResponseBytes bounds an answer (a list of many checkpoints).
const MaxResponseBytes = 4 << 20

// ClientOptions bound a client's connections; zero fields take the defaults. A call's
// own deadline is its caller's (the runner's adapter bounds each).
type ClientOptions struct {
	// DialTimeout bounds the TCP connect (default 10 s).
	DialTimeout time.Duration
	// TLSHandshakeTimeout bounds the TLS handshake (default 10 s).
	TLSHandshakeTimeout time.Duration
	// PingInterval: an HTTP/2 PING is sent on a connection that received no frame for
	// this long (default 30 s); PingTimeout: the connection is closed, failing its calls,
	// when the PING is not answered in this (default 15 s). A peer that vanished (a node
	// powered off, a dropped route) fails a call in PingInterval+PingTimeout, not at the
	// call's deadline.
	PingInterval, PingTimeout time.Duration
	// DialContext dials the TCP connection (default a net.Dialer with DialTimeout).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Default ClientOptions.
const (
	DefaultDialTimeout         = 10 * time.Second
	DefaultTLSHandshakeTimeout = 10 * time.Second
	DefaultPingInterval        = 30 * time.Second
	DefaultPingTimeout         = 15 * time.Second
)

// NewClient returns a client of the agent at addr (host:port) with tlsCfg
// (ClientTLSConfig) and the default ClientOptions. It connects on first use.
func NewClient(addr string, tlsCfg *tls.Config) (*Client, error) {
	return NewClientWith(addr, tlsCfg, ClientOptions{})
}

// NewClientWith is NewClient with o.
func NewClientWith(addr string, tlsCfg *tls.Config, o ClientOptions) (*Client, error) {
	if addr == "" {
		return nil, errors.New("nodeagent: an address")
	}
	if tlsCfg == nil {
		return nil, errors.New("nodeagent: a TLS configuration")
	}
	return newClient(addr, newHTTPClient(tlsCfg, o)), nil
}

// newHTTPClient: HTTP/2 over TLS (agent.HTTP2Config's windows) with o's bounds.
func newHTTPClient(tlsCfg *tls.Config, o ClientOptions) *http.Client {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.DialTimeout, DefaultDialTimeout)
	def(&o.TLSHandshakeTimeout, DefaultTLSHandshakeTimeout)
	def(&o.PingInterval, DefaultPingInterval)
	def(&o.PingTimeout, DefaultPingTimeout)
	if o.DialContext == nil {
		o.DialContext = (&net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	dial := o.DialContext
	dialTimeout := o.DialTimeout
	var protos http.Protocols
	protos.SetHTTP2(true)
	h2 := agent.HTTP2Config()
	h2.SendPingTimeout = o.PingInterval
	h2.PingTimeout = o.PingTimeout
	return &http.Client{Transport: &http.Transport{
		Protocols:       &protos,
		TLSClientConfig: tlsCfg,
		HTTP2:           h2,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, dialTimeout)
			defer cancel()
			return dial(ctx, network, addr)
		},
		TLSHandshakeTimeout: o.TLSHandshakeTimeout,
	}}
}

func newClient(addr string, hc *http.Client) *Client {
	return &Client{hc: hc, api: nodeagentv1connect.NewNodeAgentServiceClient(hc, "https://"+addr,
		connect.WithGRPC(), connect.WithReadMaxBytes(MaxResponseBytes))}
}

// Close drops idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Checkpoint checkpoints the Pod's sandbox; the image is the caller's until
// DeleteCheckpoint.
func (c *Client) Checkpoint(ctx context.Context, req CheckpointRequest) (CheckpointResult, error) {
	resp, err := c.api.Checkpoint(ctx, connect.NewRequest(&nodeagentv1.CheckpointRequest{
		Pod:          &nodeagentv1.PodRef{Namespace: req.Namespace, Name: req.Name, Uid: req.UID},
		SandboxId:    req.SandboxID,
		LeaveRunning: req.LeaveRunning,
	}))
	if err != nil {
		var res CheckpointResult
		var ce *connect.Error
		if errors.As(err, &ce) {
			if r, perr := strconv.ParseBool(ce.Meta().Get(SandboxRunningMeta)); perr == nil {
				res.SandboxRunning = &r
			}
		}
		return res, fmt.Errorf("node agent checkpoint: %w", err)
	}
	m := resp.Msg
	return CheckpointResult{ID: m.CheckpointId, Node: m.Node, Bytes: m.Bytes, Took: m.Took.AsDuration(), SandboxRunning: m.SandboxRunning}, nil
}

// DeleteCheckpoint deletes one of the caller's checkpoints (an unknown ID is no error).
func (c *Client) DeleteCheckpoint(ctx context.Context, checkpointID string) error {
	if _, err := c.api.DeleteCheckpoint(ctx, connect.NewRequest(&nodeagentv1.DeleteCheckpointRequest{CheckpointId: checkpointID})); err != nil {
		return fmt.Errorf("node agent delete checkpoint: %w", err)
	}
	return nil
}

// ListCheckpoints lists the caller's checkpoints on this node.
func (c *Client) ListCheckpoints(ctx context.Context) ([]*nodeagentv1.CheckpointInfo, error) {
	resp, err := c.api.ListCheckpoints(ctx, connect.NewRequest(&nodeagentv1.ListCheckpointsRequest{}))
	if err != nil {
		return nil, fmt.Errorf("node agent list checkpoints: %w", err)
	}
	return resp.Msg.Checkpoints, nil
}

// Info describes the agent.
func (c *Client) Info(ctx context.Context) (*nodeagentv1.InfoResponse, error) {
	resp, err := c.api.Info(ctx, connect.NewRequest(&nodeagentv1.InfoRequest{}))
	if err != nil {
		return nil, fmt.Errorf("node agent info: %w", err)
	}
	return resp.Msg, nil
}

// StaticDialer maps node names to agent addresses (host:port) and dials them with TLS
// (ClientTLSConfig): tests and fixed deployments. Use it by pointer; clients are cached
// per node.
type StaticDialer struct {
	Addrs map[string]string
	TLS   *tls.Config
	// Options bound the clients' connections (zero: the defaults).
	Options ClientOptions

	mu      sync.Mutex
	clients map[string]*Client
}

// ErrNoAgent is returned for a node without a known agent.
var ErrNoAgent = errors.New("nodeagent: no node agent known on the node")

// Agent returns the client of node's agent.
func (d *StaticDialer) Agent(_ context.Context, node string) (*Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.clients[node]; c != nil {
		return c, nil
	}
	addr, ok := d.Addrs[node]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrNoAgent, node)
	}
	c, err := NewClientWith(addr, d.TLS, d.Options)
	if err != nil {
		return nil, err
	}
	if d.clients == nil {
		d.clients = map[string]*Client{}
	}
	d.clients[node] = c
	return c, nil
}
