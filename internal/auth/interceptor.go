package auth

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// Interceptor authenticates every call with the Bearer API key in its Authorization
// header (UNAUTHENTICATED without a valid one) and, when Require is set, refuses keys of
// another role with PERMISSION_DENIED (reason CWSANDBOX_PERMISSION_DENIED). An admin key
// satisfies every role. The principal is put in the context (FromContext).
type Interceptor struct {
	Auth    Authenticator
	Require Role // "" accepts any role
}

// BearerToken returns the credentials of an "Authorization: Bearer <token>" header value.
// The scheme is case-insensitive (RFC 9110 §11.1): "bearer x" and "BEARER x" are "x".
func BearerToken(h string) (string, bool) {
	const scheme = "bearer "
	if len(h) <= len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return "", false
	}
	t := strings.TrimSpace(h[len(scheme):])
	return t, t != ""
}

// maxKeyBytes bounds the keys looked up (ours are 85 bytes), so that the work per request
// is constant: one lookup by key id and one hash of at most this many bytes.
const maxKeyBytes = 256

// Check authenticates the bearer key of headers h: UNAUTHENTICATED (reason
// CWSANDBOX_UNAUTHENTICATED) without a valid one. It reads headers only, never a body.
func Check(a Authenticator, h http.Header) (Principal, error) {
	key, ok := BearerToken(h.Get("Authorization"))
	if !ok {
		return Principal{}, apierr.Newf(apierr.Unauthenticated,
			"missing API key: send `authorization: Bearer <key>` (CWSANDBOX_API_KEY)")
	}
	if len(key) > maxKeyBytes {
		return Principal{}, apierr.Newf(apierr.Unauthenticated, "invalid API key")
	}
	p, err := a.Authenticate(key)
	if errors.Is(err, ErrInvalidKey) {
		return Principal{}, apierr.Newf(apierr.Unauthenticated, "invalid API key")
	}
	if err != nil {
		return Principal{}, apierr.Newf(apierr.BackendUnavailable, "cannot check the API key now: %v", err)
	}
	return p, nil
}

type verifiedKey struct{}

// WithVerified returns ctx carrying p as checked by an HTTP front (apifront) from the
// same request's headers, so the Interceptor does not look the key up a second time.
func WithVerified(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, verifiedKey{}, p)
}

type seenKey struct{}

// WithSeen returns ctx in which Authorize stores the principal it authenticated in *p,
// even when the call is then refused for its role (the audit log records who asked).
func WithSeen(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, seenKey{}, p)
}

// Authorize checks the headers of one call and returns ctx carrying the principal.
func (i Interceptor) Authorize(ctx context.Context, h http.Header) (context.Context, error) {
	p, ok := ctx.Value(verifiedKey{}).(Principal)
	if !ok {
		var err error
		if p, err = Check(i.Auth, h); err != nil {
			return nil, err
		}
	}
	if seen, ok := ctx.Value(seenKey{}).(*Principal); ok {
		*seen = p
	}
	if i.Require != "" && p.Role != i.Require && p.Role != RoleAdmin {
		return nil, apierr.Newf(apierr.PermissionDenied,
			"this call requires role %s; the API key has role %s", i.Require, p.Role)
	}
	return WithPrincipal(ctx, p), nil
}

func (i Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := i.Authorize(ctx, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (i Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := i.Authorize(ctx, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}
