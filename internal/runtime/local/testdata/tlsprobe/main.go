// Command tlsprobe runs inside test sandboxes: it resolves a name with the sandbox's
// resolv.conf and, unless -resolve, fetches https://<name>/ (trusting -ca), optionally
// connecting to -addr instead of the resolved address. It prints the body or the error.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	name := flag.String("name", "", "server name")
	addr := flag.String("addr", "", "connect here instead (ip)")
	caFile := flag.String("ca", "", "PEM CA to trust")
	resolveOnly := flag.Bool("resolve", false, "only resolve the name")
	timeout := flag.Duration("timeout", 5*time.Second, "for everything")
	flag.Parse()
	if err := run(*name, *addr, *caFile, *resolveOnly, *timeout); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
}

func run(name, addr, caFile string, resolveOnly bool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if resolveOnly {
		addrs, err := net.DefaultResolver.LookupHost(ctx, name)
		if err != nil {
			return err
		}
		fmt.Println(addrs)
		return nil
	}
	pool := x509.NewCertPool()
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return err
		}
		pool.AppendCertsFromPEM(pem)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: name}}
	if addr != "" {
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, net.JoinHostPort(addr, "443"))
		}
	}
	c := &http.Client{Transport: tr, Timeout: timeout}
	resp, err := c.Get("https://" + name + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	fmt.Print(string(b))
	return nil
}
