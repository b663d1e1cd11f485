// Command bed starts the multi-cluster test bed (package testbed) on this machine and
// keeps it up until interrupted: a control plane, two gateway replicas on one PostgreSQL,
// and three runners in network namespaces of their own. scripts/testbed.sh runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/pgtest"
	"github.com/sandboxd/sandboxd/internal/testbed"
)

func main() {
	dir := flag.String("dir", "", "work directory (default: a new temporary one)")
	dsn := flag.String("store", "", "PostgreSQL DSN (default: a throwaway server)")
	flag.Parse()
	if err := run(*dir, *dsn); err != nil {
		fmt.Fprintln(os.Stderr, "bed:", err)
		os.Exit(1)
	}
}

func run(dir, dsn string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if dir == "" {
		d, err := os.MkdirTemp("", "sandboxd-bed-")
		if err != nil {
			return err
		}
		dir = d
	}
	if dsn == "" {
		stopPG, d, err := pgtest.Start()
		if err != nil {
			return err
		}
		defer stopPG()
		dsn = d
	}
	bin := filepath.Join(dir, "bin")
	if err := testbed.Build(bin); err != nil {
		return err
	}
	b, err := testbed.Start(ctx, testbed.Config{Dir: dir, Bin: bin, DSN: dsn, Runners: testbed.Standard()})
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Printf("control plane   https://%s (CA %s)\n", b.CP.Addr, b.CAFile)
	for i, g := range b.Gateways {
		fmt.Printf("gateway %d       %s (log %s)\n", i, b.GatewayURL(i), g.Log())
	}
	for i, r := range b.Runners {
		fmt.Printf("%-15s %s (log %s)\n", r.Name, b.RunnerAddr(i), r.Log())
	}
	fmt.Printf("\nexport CWSANDBOX_BASE_URL=%s CWSANDBOX_API_KEY=%s\n", b.GatewayURL(0), b.UserKey)
	fmt.Printf("admin key: %s\n\nup; ^C tears everything down\n", b.AdminKey)
	<-ctx.Done()
	return nil
}
