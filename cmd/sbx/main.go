// Command sbx runs and manages sandboxes through the coreweave.sandbox.v1 API; see
// `sbx --help`. Everything but process setup lives in internal/sbxcli.
package main

import (
	"context"
	"os"

	"github.com/sandboxd/sandboxd/internal/sbxcli"
)

func main() {
	ctx, stop := sbxcli.SignalContext(context.Background())
	code := sbxcli.ExecuteContext(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
