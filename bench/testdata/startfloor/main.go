// Command startfloor is BenchmarkAgentStart's floor: the least a static Go server can do
// to answer — start, accept one connection on the inherited listening socket (fd 3), as
// sandbox-agent does, write one byte, then block until the peer closes. Only syscall, so
// no package init but the runtime's and os's.
package main

import "syscall"

func main() {
	fd, _, err := syscall.Accept(3)
	if err != nil {
		syscall.Exit(2)
	}
	if _, err := syscall.Write(fd, []byte{1}); err != nil {
		syscall.Exit(2)
	}
	var b [1]byte
	_, _ = syscall.Read(fd, b[:])
}
