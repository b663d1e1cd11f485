package edgebench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// clientTLS is the load generator's TLS configuration. X25519 only: HAProxy's OpenSSL 3.0
// has no post-quantum key exchange, and a Go client would otherwise negotiate the much
// dearer X25519MLKEM768 with the edge alone, which measures key exchanges, not proxies.
func clientTLS(roots *x509.CertPool, serverName string) *tls.Config {
	return &tls.Config{
		RootCAs:          roots,
		ServerName:       serverName,
		CurvePreferences: []tls.CurveID{tls.X25519},
		MinVersion:       tls.VersionTLS13,
	}
}

// workers runs n copies of work until d is over and sums what they count.
func workers(n int, d time.Duration, work func(ctx context.Context, count *atomic.Int64) error) (int64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		total   atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := work(ctx, &total); err != nil && ctx.Err() == nil {
				errOnce.Do(func() { first = err; cancel() })
			}
		}()
	}
	wg.Wait()
	return total.Load(), time.Since(start), first
}

// requestsPerSecond: conc clients each send GET after GET on one keep-alive HTTP/1.1
// connection, the common case for an API behind the edge.
func requestsPerSecond(addr, host string, roots *x509.CertPool, conc int, d time.Duration) (float64, error) {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	tr := &http.Transport{
		TLSClientConfig: clientTLS(roots, host),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
		MaxIdleConnsPerHost: conc,
		Protocols:           p,
	}
	defer tr.CloseIdleConnections()
	url := "https://" + host + "/"
	n, took, err := workers(conc, d, func(ctx context.Context, count *atomic.Int64) error {
		for ctx.Err() == nil {
			if err := get(ctx, tr, url); err != nil {
				return err
			}
			count.Add(1)
		}
		return nil
	})
	return float64(n) / took.Seconds(), err
}

func get(ctx context.Context, rt http.RoundTripper, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, res.Status)
	}
	return err
}

// connectionsPerSecond: conc clients each open a new TLS connection (full handshake, no
// resumption), send one request and close, again and again.
func connectionsPerSecond(addr, host string, roots *x509.CertPool, conc int, d time.Duration) (float64, error) {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	n, took, err := workers(conc, d, func(ctx context.Context, count *atomic.Int64) error {
		tr := &http.Transport{
			TLSClientConfig: clientTLS(roots, host),
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			},
			DisableKeepAlives: true,
			Protocols:         p,
		}
		url := "https://" + host + "/"
		for ctx.Err() == nil {
			if err := get(ctx, tr, url); err != nil {
				return err
			}
			count.Add(1)
		}
		return nil
	})
	return float64(n) / took.Seconds(), err
}

// passthroughMBps: conc TLS connections through the proxy to the workload, which writes
// as fast as it can; the figure is what the clients receive, in MB/s.
func passthroughMBps(addr, host string, roots *x509.CertPool, conc int, d time.Duration) (float64, error) {
	n, took, err := workers(conc, d, func(ctx context.Context, count *atomic.Int64) error {
		raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		c := tls.Client(raw, clientTLS(roots, host))
		defer c.Close()
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		if err := c.HandshakeContext(ctx); err != nil {
			return fmt.Errorf("handshake through %s: %w", addr, err)
		}
		buf := make([]byte, 64<<10)
		for {
			k, err := c.Read(buf)
			count.Add(int64(k))
			if err != nil {
				return err
			}
		}
	})
	return float64(n) / took.Seconds() / 1e6, err
}
