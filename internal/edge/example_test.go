package edge_test

import (
	"context"
	"log"
	"net"
	"net/netip"
	"time"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// A runner serves its sandboxes' endpoints: the wildcard certificate from the platform
// CA, a Table it updates as sandboxes come and go, and one listener.
func Example() {
	ca, err := pki.LoadOrCreateCA("/var/lib/sandboxd/ca", "sandboxd")
	if err != nil {
		log.Fatal(err)
	}
	cert, err := edge.WildcardCertificate(ca, "r1", "sandboxes.example.com", 0)
	if err != nil {
		log.Fatal(err)
	}
	var routes edge.Table
	e, err := edge.New(edge.Config{
		RunnerID: "r1", BaseDomain: "sandboxes.example.com", Routes: &routes, GetCertificate: cert,
		Authorize: func(ctx context.Context, token, org string) error { return edge.ErrUnauthenticated },
	})
	if err != nil {
		log.Fatal(err)
	}
	// Once sandbox abcdefghijklmn23 is RUNNING with a public HTTPS endpoint on port 8080:
	err = routes.Set("abcdefghijklmn23", []edge.Route{{
		SandboxID: "abcdefghijklmn23", Org: "acme", Port: 8080, Kind: edge.KindHTTPS,
		Backend: netip.MustParseAddrPort("10.88.0.7:8080"),
	}})
	if err != nil {
		log.Fatal(err)
	}
	log.Print("serving https://" + edge.Host(8080, "abcdefghijklmn23", "r1", "sandboxes.example.com"))
	ln, err := net.Listen("tcp", ":443")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = e.Serve(ln) }()
	// On shutdown:
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.Shutdown(ctx)
}
