package kubernetes

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestRegistryImageConfigRefusesHostLocal: an image reference at a port of the runner's own
// host (or its metadata address) is refused before any connection, and the error names
// the image, not what answers there (issue 15 §4).
func TestRegistryImageConfigRefusesHostLocal(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, ref := range []string{
		ln.Addr().String() + "/x:1",
		"localhost:" + itoa(port) + "/x",
		"[::1]:" + itoa(port) + "/x",
		"169.254.169.254/x",
		"0.0.0.0:" + itoa(port) + "/x",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := RegistryImageConfig(ctx, ref, nil)
		cancel()
		if !errors.Is(err, runtime.ErrInvalidImageRef) {
			t.Errorf("%s: %v, want refused as an invalid reference", ref, err)
			continue
		}
		for _, leak := range []string{"connection refused", "HTTP response", "x509", "EOF"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("%s: the error tells what answered: %v", ref, err)
			}
		}
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("%d connections reached the host's listener", n)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
