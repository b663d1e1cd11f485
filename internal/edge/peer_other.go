//go:build !unix

package edge

import "net"

// peerProbe cannot peek at a socket here; a request on a connection the peer closed is
// retried when it can be.
type peerProbe struct{}

func (*peerProbe) init(net.Conn) {}
func (*peerProbe) open() bool    { return true }
