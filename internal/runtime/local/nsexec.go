package local

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
)

// inNamespace runs fn on an OS thread that has joined the namespace (of kind nstype, a
// CLONE_NEW* flag) at path. The thread is never unlocked, so it dies with its goroutine
// and Go never reuses a thread left in a sandbox's namespace.
func inNamespace(path string, nstype int, fn func() error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	errc := make(chan error, 1)
	network.SpoilThread(func() { // never the main thread, which Go would keep, wedged there
		if err := unix.Setns(int(f.Fd()), nstype); err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- fn()
	})
	return <-errc
}
