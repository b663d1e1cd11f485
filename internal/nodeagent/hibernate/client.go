package hibernate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The ttrpc service and its methods (gVisor pkg/shim/v1/taskserver/server.go).
const (
	service          = "gvisor.task.TaskService"
	methodCheckpoint = "Checkpoint"
	methodWait       = "Wait"
	methodVersion    = "Version"
)

// ttrpc framing (containerd/ttrpc channel.go): a 10-byte header (length and stream ID,
// big-endian uint32s; message type; flags), then the message.
const (
	headerLen       = 10
	typeRequest     = 0x1
	typeResponse    = 0x2
	maxRequestLen   = 64 << 10 // our requests are a few hundred bytes
	maxResponseLen  = 4 << 20  // ttrpc's own cap: an error reply carries runsc's output (clipped to maxErrorMessage)
	waitCheckpoint  = 1        // gvisor.task.WaitRequest.WaitType CHECKPOINT
	maxErrorMessage = 1 << 10
)

// Client is a connection to one shim's hibernate server. Calls are serialized (one at a
// time on the connection); Close ends it.
type Client struct {
	mu     sync.Mutex
	conn   net.Conn
	next   uint32 // next stream ID: odd, from 1 (ttrpc's client side)
	broken error  // set once the stream is out of step: every later call fails
}

// Dial connects to the hibernate server at socket (SocketPath).
func Dial(ctx context.Context, socket string) (*Client, error) {
	if err := absClean(socket); err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDial, err)
	}
	return &Client{conn: conn, next: 1}, nil
}

// ErrDial: the shim's hibernate server could not be reached (no socket: the sandbox
// ended, or the shim is not sandboxd's patched one).
var ErrDial = errors.New("hibernate: dial")

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// CheckpointRequest is gvisor.task.CheckpointRequest (the fields sandboxd sets).
type CheckpointRequest struct {
	// ContainerID is the Pod sandbox's ID (the runsc sandbox's root container): runsc
	// checkpoints the whole sandbox.
	ContainerID string
	// ImagePath is the image directory (CreateImageDir).
	ImagePath string
	// LeaveRunning keeps the sandbox running after the checkpoint (a fork); without it the
	// sandbox's containers end (a pause).
	LeaveRunning bool
	// Direct writes the image with O_DIRECT.
	Direct bool
	// Compression is runsc's --compression ("" = runsc's default).
	Compression string
}

func (r CheckpointRequest) marshal() ([]byte, error) {
	if err := ValidContainerID(r.ContainerID); err != nil {
		return nil, err
	}
	if err := absClean(r.ImagePath); err != nil {
		return nil, err
	}
	switch r.Compression {
	case "", "none", "flate-best-speed":
	default:
		return nil, fmt.Errorf("%w compression %q: want none or flate-best-speed", ErrInvalid, clip(r.Compression))
	}
	var b []byte
	b = appendString(b, 1, r.ContainerID)
	b = appendString(b, 2, r.ImagePath)
	b = appendBool(b, 3, r.Direct)
	b = appendBool(b, 4, r.LeaveRunning)
	b = appendString(b, 6, r.Compression)
	return b, nil
}

// Checkpoint checkpoints the sandbox into r.ImagePath (`runsc checkpoint` in the shim). It
// returns once runsc's checkpoint command has.
func (c *Client) Checkpoint(ctx context.Context, r CheckpointRequest) error {
	payload, err := r.marshal()
	if err != nil {
		return err
	}
	_, err = c.call(ctx, methodCheckpoint, payload)
	return err
}

// WaitCheckpoint waits for the next checkpoint of containerID's sandbox to finish (Wait
// with wait type CHECKPOINT: `runsc wait --checkpoint`) and returns the exit status of
// that wait. It returns only after a checkpoint that began after it was called: call it
// first, on another Client (calls on one Client are serialized), then Checkpoint. A
// sandbox that a checkpoint ended (LeaveRunning false) has nothing to wait on: an error.
//
// The caller cannot know when the wait is registered: the shim runs `runsc wait
// --checkpoint`, which waits for "the sandbox's checkpoint count + 1" only once it has
// reached the sandbox (on a loaded host, seconds after this call was sent). A checkpoint
// that finishes before then is not waited for: bound the call with ctx, and when it has
// not returned a while after a Checkpoint, take another (LeaveRunning) checkpoint.
func (c *Client) WaitCheckpoint(ctx context.Context, containerID string) (int32, error) {
	req, err := waitRequest(containerID)
	if err != nil {
		return 0, err
	}
	resp, err := c.call(ctx, methodWait, req)
	if err != nil {
		return 0, err
	}
	v, err := varintField(resp, 1) // WaitResponse.exit_status
	return int32(v), err
}

// waitRequest is gvisor.task.WaitRequest{id, wait_type: CHECKPOINT}.
func waitRequest(containerID string) ([]byte, error) {
	if err := ValidContainerID(containerID); err != nil {
		return nil, err
	}
	var req []byte
	req = appendString(req, 1, containerID)
	req = protowire.AppendTag(req, 2, protowire.VarintType)
	req = protowire.AppendVarint(req, waitCheckpoint)
	return req, nil
}

// Version returns the shim's version string (a liveness check of the server).
func (c *Client) Version(ctx context.Context) (string, error) {
	resp, err := c.call(ctx, methodVersion, nil)
	if err != nil {
		return "", err
	}
	return stringField(resp, 1) // VersionResponse.version
}

// call makes one unary call and returns the response's payload.
func (c *Client) call(ctx context.Context, method string, payload []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return nil, c.broken
	}
	// A context already done never touches the connection (it stays usable).
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("hibernate %s: %w", method, err)
	}
	sid := c.next
	c.next += 2
	msg, err := marshalRequest(ctx, method, payload)
	if err != nil {
		return nil, err
	}
	// The deadline bounds the exchange; a cancelled context interrupts it.
	dl, hasDL := ctx.Deadline()
	_ = c.conn.SetDeadline(dl)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = c.conn.SetDeadline(time.Unix(1, 0))
		close(fired)
	})
	// A callback that started runs to its end before the next call sets its own deadline
	// (which replaces this one): it never leaks into that call.
	defer func() {
		if !stop() {
			<-fired
		}
	}()
	resp, err := c.exchange(sid, msg)
	if err != nil {
		// The connection is out of step (a half-written request, an unread answer).
		c.broken = fmt.Errorf("hibernate: connection unusable after a failed %s: %w", method, err)
		c.conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("hibernate %s: %w", method, ctx.Err())
		}
		if hasDL && !time.Now().Before(dl) { // the connection's deadline came a hair first
			return nil, fmt.Errorf("hibernate %s: %w", method, context.DeadlineExceeded)
		}
		return nil, fmt.Errorf("hibernate %s: %w", method, err)
	}
	return parseResponse(method, resp)
}

func (c *Client) exchange(sid uint32, msg []byte) ([]byte, error) {
	if _, err := c.conn.Write(frame(sid, typeRequest, msg)); err != nil {
		return nil, err
	}
	h := make([]byte, headerLen)
	if _, err := io.ReadFull(c.conn, h); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(h[0:4])
	if n > maxResponseLen {
		return nil, fmt.Errorf("response of %d bytes (at most %d)", n, maxResponseLen)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c.conn, body); err != nil {
		return nil, err
	}
	// One stream is open on this connection: anything but its response is a protocol error.
	if got := binary.BigEndian.Uint32(h[4:8]); got != sid || h[8] != typeResponse {
		return nil, fmt.Errorf("unexpected message type %d on stream %d (want a response on %d)", h[8], got, sid)
	}
	return body, nil
}

// frame is a ttrpc message: header, then msg.
func frame(sid uint32, typ byte, msg []byte) []byte {
	b := make([]byte, headerLen, headerLen+len(msg))
	binary.BigEndian.PutUint32(b[0:4], uint32(len(msg)))
	binary.BigEndian.PutUint32(b[4:8], sid)
	b[8] = typ
	b[9] = 0 // flags: a unary request
	return append(b, msg...)
}

// marshalRequest is ttrpc.Request{service, method, payload, timeout_nano}.
func marshalRequest(ctx context.Context, method string, payload []byte) ([]byte, error) {
	var b []byte
	b = appendString(b, 1, service)
	b = appendString(b, 2, method)
	if len(payload) > 0 {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, payload)
	}
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d > 0 {
			b = protowire.AppendTag(b, 4, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(d.Nanoseconds()))
		}
	}
	if len(b) > maxRequestLen {
		return nil, fmt.Errorf("%w: request of %d bytes", ErrInvalid, len(b))
	}
	return b, nil
}

// parseResponse reads ttrpc.Response{status = 1 (google.rpc.Status), payload = 2}.
func parseResponse(method string, b []byte) ([]byte, error) {
	var (
		st      *status.Status
		payload []byte
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("hibernate %s: bad response: %w", method, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("hibernate %s: bad response status: %w", method, protowire.ParseError(n))
			}
			st = &status.Status{}
			if err := proto.Unmarshal(v, st); err != nil {
				return nil, fmt.Errorf("hibernate %s: bad response status: %w", method, err)
			}
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("hibernate %s: bad response payload: %w", method, protowire.ParseError(n))
			}
			payload = v
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, fmt.Errorf("hibernate %s: bad response: %w", method, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	if st != nil && st.Code != 0 {
		return nil, &CallError{Method: method, Code: st.Code, Message: clipN(st.Message, maxErrorMessage)}
	}
	return payload, nil
}

// CallError is the shim's error status for a call (a gRPC code and message: runsc's
// output on a failed checkpoint, say).
type CallError struct {
	Method  string
	Code    int32
	Message string
}

// CodeUnimplemented is CallError.Code for a call the shim has no handler for: the shim
// answers in ttrpc, whose status codes are gRPC's (google.rpc.Code), and UNIMPLEMENTED
// is 12 there. A connect.Code has the same numbers, but this is not a connect status.
const CodeUnimplemented int32 = 12

func (e *CallError) Error() string {
	return fmt.Sprintf("hibernate %s: shim: %s (code %d)", e.Method, e.Message, e.Code)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, 1)
}

// varintField is the last value of varint field num in message b (0 when absent).
func varintField(b []byte, num protowire.Number) (uint64, error) {
	var v uint64
	err := eachField(b, func(n protowire.Number, t protowire.Type, b []byte) (int, error) {
		if n == num && t == protowire.VarintType {
			x, m := protowire.ConsumeVarint(b)
			v = x
			return m, nil
		}
		return protowire.ConsumeFieldValue(n, t, b), nil
	})
	return v, err
}

// stringField is the last value of string field num in message b ("" when absent).
func stringField(b []byte, num protowire.Number) (string, error) {
	var v string
	err := eachField(b, func(n protowire.Number, t protowire.Type, b []byte) (int, error) {
		if n == num && t == protowire.BytesType {
			x, m := protowire.ConsumeString(b)
			v = clipN(x, maxErrorMessage)
			return m, nil
		}
		return protowire.ConsumeFieldValue(n, t, b), nil
	})
	return v, err
}

func eachField(b []byte, f func(protowire.Number, protowire.Type, []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errors.New("hibernate: bad response message: " + protowire.ParseError(n).Error())
		}
		b = b[n:]
		m, err := f(num, typ, b)
		if err != nil {
			return err
		}
		if m < 0 {
			return errors.New("hibernate: bad response message: " + protowire.ParseError(m).Error())
		}
		b = b[m:]
	}
	return nil
}

func clipN(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
