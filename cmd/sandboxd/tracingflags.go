package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/sandboxd/sandboxd/internal/tracing"
)

// tracingFlags are --otlp-endpoint, --otlp-protocol and --trace-sample-ratio: OpenTelemetry
// tracing, off unless an endpoint is given (on the command line or in
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT). docs/observability.md.
type tracingFlags struct {
	cfg tracing.Config
}

// bind declares the flags; service is the process's service.name (sandboxd-gateway, …).
// Their defaults come from the standard environment variables (getenv).
func (t *tracingFlags) bind(fs *flag.FlagSet, service string, getenv func(string) string) {
	t.cfg.ServiceName = service
	endpoint := getenv(tracing.EnvTracesEndpoint)
	if endpoint == "" {
		endpoint = getenv(tracing.EnvEndpoint)
	}
	protocol := getenv(tracing.EnvProtocol)
	if protocol == "" {
		protocol = tracing.ProtocolGRPC
	}
	fs.StringVar(&t.cfg.Endpoint, "otlp-endpoint", endpoint, "OTLP receiver spans are exported to: http://HOST:PORT (plaintext), https://HOST:PORT or HOST:PORT (TLS unless loopback); empty: no tracing (default $"+tracing.EnvTracesEndpoint+" or $"+tracing.EnvEndpoint+")")
	fs.StringVar(&t.cfg.Protocol, "otlp-protocol", protocol, "OTLP protocol: grpc or http/protobuf (default $"+tracing.EnvProtocol+" or grpc)")
	fs.Float64Var(&t.cfg.SampleRatio, "trace-sample-ratio", 1, "share of API calls traced, 0 to 1 (with --otlp-endpoint)")
	fs.Func("trace-batch-timeout", "longest a finished span waits to be exported (default 5s)", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		t.cfg.BatchTimeout = d
		return nil
	})
}

func (t tracingFlags) validate() error {
	if r := t.cfg.SampleRatio; !(r >= 0 && r <= 1) {
		return fmt.Errorf("--trace-sample-ratio %v: want 0 to 1", r)
	}
	if p := t.cfg.Protocol; p != tracing.ProtocolGRPC && p != tracing.ProtocolHTTP {
		return fmt.Errorf("--otlp-protocol %q: want %s or %s", p, tracing.ProtocolGRPC, tracing.ProtocolHTTP)
	}
	if t.cfg.BatchTimeout < 0 {
		return fmt.Errorf("--trace-batch-timeout %v: want ≥ 0", t.cfg.BatchTimeout)
	}
	if err := t.cfg.Validate(); err != nil {
		return fmt.Errorf("--otlp-endpoint: %w", err)
	}
	return nil
}

// start turns tracing on for the process; stop flushes what is left (on the way out).
func (t tracingFlags) start(ctx context.Context, log *slog.Logger) (stop func(), err error) {
	shutdown, err := tracing.Setup(ctx, t.cfg, log)
	if err != nil {
		return func() {}, err
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("tracing: flush on exit", "err", err)
		}
	}, nil
}
