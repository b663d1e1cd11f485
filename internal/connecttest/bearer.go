package connecttest

import (
	"context"

	"connectrpc.com/connect"
)

// Bearer is a client interceptor that sends an API key ("Authorization: Bearer KEY") on
// every unary call and stream: connect.WithInterceptors(connecttest.Bearer(key)).
type Bearer string

func (k Bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(k))
		return next(ctx, req)
	}
}

func (k Bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(k))
		return conn
	}
}

func (k Bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
