package testenv

import (
	"net"
	"sync"
)

var (
	addrMu   sync.Mutex
	addrGone = map[string]bool{}
)

// FreeAddr is a loopback TCP address (127.0.0.1:port) free when it returns, for a child
// process to listen on, and never one an earlier call of this process handed out: the
// kernel may give a port just closed to the next bind of :0, and two listeners of one
// child (its API and its metrics) handed one port fail with "address already in use".
func FreeAddr() (string, error) {
	addrMu.Lock()
	defer addrMu.Unlock()
	// Every probe stays bound until one is new, so the kernel cannot hand the same port
	// back within this call.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		held = append(held, l)
		a := l.Addr().String()
		if !addrGone[a] {
			addrGone[a] = true
			return a, nil
		}
	}
}
