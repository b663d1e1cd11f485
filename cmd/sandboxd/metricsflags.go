package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"

	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Default --metrics-listen addresses: loopback, one port per process kind so that the
// processes of one host never collide (docs/observability.md).
const (
	defaultMetricsDev          = "127.0.0.1:9464"
	defaultMetricsControlPlane = "127.0.0.1:9465"
	defaultMetricsGateway      = "127.0.0.1:9466"
	defaultMetricsRunner       = "127.0.0.1:9467"
)

// metricsFlags is --metrics-listen: the separate listener GET /metrics is served on
// (never the API ports).
type metricsFlags struct {
	listen, def string
}

func (m *metricsFlags) bind(fs *flag.FlagSet, def string) {
	m.def = def
	fs.StringVar(&m.listen, "metrics-listen", def, "address of the Prometheus metrics listener, GET /metrics only (empty: none); keep it off the public network")
}

func (m metricsFlags) validate() error {
	if m.listen == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(m.listen); err != nil {
		return fmt.Errorf("--metrics-listen: %w", err)
	}
	return nil
}

// start serves the process's metrics until ctx ends. The default address taken (another
// process of the same kind on this host, a test suite's) only warns: metrics are left
// out; an address given on the command line that cannot be bound is an error.
func (m metricsFlags) start(ctx context.Context, log *slog.Logger) error {
	_, err := metrics.Default.Listen(ctx, m.listen, log)
	if err != nil {
		if m.listen == m.def {
			log.Warn("no metrics listener: its default address is taken; give --metrics-listen", "addr", m.listen, "err", err)
			return nil
		}
		return fmt.Errorf("--metrics-listen: %w", err)
	}
	return nil
}

// startStore starts the listener and registers the store's view: the sandbox series
// (sandbox_info, sandboxes by state) when sandboxes, the runner series when runners.
func (m metricsFlags) startStore(ctx context.Context, st store.Store, sandboxes, runners bool, log *slog.Logger) error {
	if m.listen == "" {
		return nil
	}
	v := metrics.StoreView{Orgs: st.Orgs(), Logger: log}
	if sandboxes {
		v.Sandboxes = st.Sandboxes()
	}
	if runners {
		v.Runners = st.Runners()
	}
	if err := metrics.Default.RegisterStore(v); err != nil {
		return err
	}
	return m.start(ctx, log)
}
