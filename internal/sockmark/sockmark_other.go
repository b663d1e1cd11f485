//go:build !linux

package sockmark

import "syscall"

// Control returns nil: marks exist on Linux only, and so does the network they open.
func Control(uint32) func(network, address string, c syscall.RawConn) error { return nil }
