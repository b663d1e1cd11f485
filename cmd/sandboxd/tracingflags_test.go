package main

import (
	"flag"
	"io"
	"testing"

	"github.com/sandboxd/sandboxd/internal/tracing"
)

// TestTracingFlagsEnv: the standard OTEL_EXPORTER_OTLP_* variables are the defaults
// (the traces-specific endpoint first); the command line wins; without either, off.
func TestTracingFlagsEnv(t *testing.T) {
	parse := func(env map[string]string, args ...string) tracing.Config {
		t.Helper()
		var f tracingFlags
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.bind(fs, "sandboxd-test", func(k string) string { return env[k] })
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := f.validate(); err != nil {
			t.Fatal(err)
		}
		return f.cfg
	}
	if c := parse(nil); c.Enabled() || c.Protocol != tracing.ProtocolGRPC || c.SampleRatio != 1 || c.ServiceName != "sandboxd-test" {
		t.Errorf("defaults %+v", c)
	}
	env := map[string]string{tracing.EnvEndpoint: "http://a:4317", tracing.EnvProtocol: tracing.ProtocolHTTP}
	if c := parse(env); c.Endpoint != "http://a:4317" || c.Protocol != tracing.ProtocolHTTP {
		t.Errorf("from the environment %+v", c)
	}
	env[tracing.EnvTracesEndpoint] = "http://b:4318"
	if c := parse(env); c.Endpoint != "http://b:4318" {
		t.Errorf("traces endpoint %+v", c)
	}
	if c := parse(env, "--otlp-endpoint", "", "--trace-batch-timeout", "1s"); c.Enabled() || c.BatchTimeout.String() != "1s" {
		t.Errorf("flag over the environment %+v", c)
	}
}
