// Package sockmark marks the sockets a net.Dialer opens (SO_MARK), so that host
// firewall rules can tell them apart: the local network's output guard lets only
// connections carrying its mark into the sandbox bridge (internal/runtime/local/network).
package sockmark
