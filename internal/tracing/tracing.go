// Package tracing is sandboxd's OpenTelemetry tracing: the configuration every process
// takes (--otlp-endpoint, off unless given), the OTLP exporter, and the few hooks the rest
// of the code calls — interceptors for the Connect hops (public API, runner API, runner →
// agent) and spans around the steps of a create. Everything here is a no-op while
// tracing is off (the global tracer provider is OpenTelemetry's no-op one).
//
// What a span may carry: names of procedures and steps, sandbox and runner IDs, gRPC
// codes. Never a secret, an environment value, an exec argument, a path, a file's content
// or an error message (a message can quote any of these): End records the gRPC code of
// an error only.
package tracing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sandboxd/sandboxd/internal/version"
)

// Protocols of the OTLP exporter (the values of OTEL_EXPORTER_OTLP_PROTOCOL it supports).
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Environment variables the flags' defaults come from (the OpenTelemetry standard ones).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" // wins over EnvEndpoint
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
)

// Config configures tracing of one process. The zero value is off.
type Config struct {
	// Endpoint is the OTLP receiver: http://host:port (plaintext), https://host:port
	// (TLS, the system's roots) or host:port (TLS unless the host is loopback). Empty:
	// tracing is off. For ProtocolHTTP a URL path other than "/" is used as is, else
	// /v1/traces.
	Endpoint string
	// Protocol is ProtocolGRPC ("" too) or ProtocolHTTP.
	Protocol string
	// SampleRatio is the share of new traces recorded, 0 to 1. A trace continued from a
	// sandboxd process (the runner API) follows that process's decision; a public
	// caller's trace context never decides (see PublicServer).
	SampleRatio float64
	// ServiceName is service.name of the process's spans (sandboxd-gateway, …).
	ServiceName string
	// BatchTimeout is how long spans wait to be exported at most (0: 5 s).
	BatchTimeout time.Duration
}

// defaultBatchTimeout is Config.BatchTimeout's default.
const defaultBatchTimeout = 5 * time.Second

// Enabled reports whether c turns tracing on.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// Validate checks c without I/O.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	if _, _, err := c.target(); err != nil {
		return err
	}
	switch c.Protocol {
	case "", ProtocolGRPC, ProtocolHTTP:
	default:
		return fmt.Errorf("otlp protocol %q: want %s or %s", c.Protocol, ProtocolGRPC, ProtocolHTTP)
	}
	if !(c.SampleRatio >= 0 && c.SampleRatio <= 1) { // NaN fails too
		return fmt.Errorf("trace sample ratio %v: want 0 to 1", c.SampleRatio)
	}
	if c.ServiceName == "" {
		return errors.New("tracing: a service name is required")
	}
	if c.BatchTimeout < 0 {
		return fmt.Errorf("trace batch timeout %v: want ≥ 0", c.BatchTimeout)
	}
	return nil
}

// target is the endpoint as a URL (scheme http or https, host:port) and whether it is
// plaintext.
func (c Config) target() (*url.URL, bool, error) {
	e := c.Endpoint
	if !strings.Contains(e, "://") {
		host, port, err := net.SplitHostPort(e)
		if err != nil || port == "" {
			return nil, false, fmt.Errorf("otlp endpoint %q: want http://host:port, https://host:port or host:port", e)
		}
		scheme := "https"
		if isLoopback(host) {
			scheme = "http"
		}
		e = scheme + "://" + e
	}
	u, err := url.Parse(e)
	if err != nil {
		return nil, false, fmt.Errorf("otlp endpoint %q: %w", c.Endpoint, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, false, fmt.Errorf("otlp endpoint %q: want http://host:port, https://host:port or host:port", c.Endpoint)
	}
	return u, u.Scheme == "http", nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Setup turns tracing on as c says, for the whole process (the global tracer provider),
// and returns the function that flushes and stops it. With c off it does nothing. The
// exporter connects lazily: a receiver that is down loses spans (logged, at most once a
// minute), it never stops or slows the process.
func Setup(ctx context.Context, c Config, log *slog.Logger) (shutdown func(context.Context) error, err error) {
	nop := func(context.Context) error { return nil }
	if err := c.Validate(); err != nil {
		return nop, err
	}
	if !c.Enabled() {
		return nop, nil
	}
	if log == nil {
		log = slog.Default()
	}
	u, plain, _ := c.target()
	var exp sdktrace.SpanExporter
	if c.Protocol == ProtocolHTTP {
		target := *u
		if target.Path == "" || target.Path == "/" {
			target.Path = "/v1/traces"
		}
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(target.String())}
		if plain {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	} else {
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(u.Host)}
		if plain {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	}
	if err != nil {
		return nop, fmt.Errorf("otlp exporter: %w", err)
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", c.ServiceName),
		attribute.String("service.version", version.String()),
	)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(newBatcher(exp, cmp.Or(c.BatchTimeout, defaultBatchTimeout), batchQueueSize, batchSize)),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
		// Bounds per span (every one given: a raw limit of 0 allows none). No span of ours
		// comes near them.
		sdktrace.WithRawSpanLimits(sdktrace.SpanLimits{
			AttributeValueLengthLimit: 256, AttributeCountLimit: 32, EventCountLimit: 32,
			LinkCountLimit: 4, AttributePerEventCountLimit: 8, AttributePerLinkCountLimit: 8,
		}),
	)
	otel.SetErrorHandler(rateLimited(log))
	otel.SetTracerProvider(tp)
	log.Info("tracing on", "otlp_endpoint", u.Scheme+"://"+u.Host, "protocol", cmp.Or(c.Protocol, ProtocolGRPC), "sample_ratio", c.SampleRatio)
	return tp.Shutdown, nil
}

// rateLimited logs the SDK's errors (an unreachable receiver) at most once a minute.
func rateLimited(log *slog.Logger) otel.ErrorHandler {
	var mu sync.Mutex
	var last time.Time
	var dropped int
	return otel.ErrorHandlerFunc(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) < time.Minute {
			dropped++
			return
		}
		log.Warn("tracing: export failed", "err", err, "errors_not_logged", dropped)
		last, dropped = time.Now(), 0
	})
}
