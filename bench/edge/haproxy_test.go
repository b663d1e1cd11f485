package edgebench

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// haproxyConfig gives HAProxy the edge's two jobs: end TLS and proxy HTTP/1.1 with
// keep-alive to the backend (X-Forwarded-For added, as the edge does), and route TLS by
// SNI to the passthrough backend without decrypting, with splice(2) as the edge uses.
// Two threads: the machine's cores.
const haproxyConfig = `global
	nbthread 2
	maxconn 4096
	ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
	timeout connect 5s
	timeout client 60s
	timeout server 60s
frontend https
	mode http
	bind {{httpsAddr}} ssl crt {{pem}} alpn h2,http/1.1
	option forwardfor
	http-request set-header X-Forwarded-Proto https
	default_backend sandbox_http
backend sandbox_http
	mode http
	http-reuse always
	server s1 {{httpBackend}}
frontend passthrough
	mode tcp
	bind {{tlsAddr}}
	tcp-request inspect-delay 10s
	tcp-request content accept if { req_ssl_hello_type 1 }
	use_backend sandbox_tls if { req_ssl_sni -m end .{{domain}} }
backend sandbox_tls
	mode tcp
	option splice-auto
	server s2 {{tlsBackend}}
`

func startHAProxy(dir string, ca *pki.CA, httpBackend, tlsBackend netip.AddrPort) (target, error) {
	name := "*." + runnerID + "." + baseDomain
	cert, err := ca.IssueServer(name, []string{name}, nil, time.Hour)
	if err != nil {
		return target{}, err
	}
	if err := pki.WriteKeyPair(dir, "haproxy", cert); err != nil {
		return target{}, err
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, "haproxy.pem"))
	if err != nil {
		return target{}, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "haproxy-key.pem"))
	if err != nil {
		return target{}, err
	}
	pem := filepath.Join(dir, "haproxy-bundle.pem") // HAProxy wants certificate and key in one file
	if err := os.WriteFile(pem, append(certPEM, keyPEM...), 0o600); err != nil {
		return target{}, err
	}
	httpsAddr, tlsAddr := freeAddr(), freeAddr()
	cfg := strings.NewReplacer(
		"{{httpsAddr}}", httpsAddr, "{{tlsAddr}}", tlsAddr, "{{pem}}", pem, "{{domain}}", runnerID+"."+baseDomain,
		"{{httpBackend}}", httpBackend.String(), "{{tlsBackend}}", tlsBackend.String(),
	).Replace(haproxyConfig)
	cfgPath := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return target{}, err
	}
	logPath := filepath.Join(dir, "haproxy.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return target{}, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command("haproxy", "-db", "-f", cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return target{}, fmt.Errorf("start haproxy: %w", err)
	}
	cleanups = append(cleanups, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, a := range []string{httpsAddr, tlsAddr} {
		if err = waitListening(a, 5*time.Second); err != nil {
			out, _ := os.ReadFile(logPath)
			return target{}, fmt.Errorf("haproxy: %w; its output: %s", err, out)
		}
	}
	return target{name: "haproxy", httpsAddr: httpsAddr, tlsAddr: tlsAddr, pid: cmd.Process.Pid}, nil
}

// freeAddr returns a loopback address nothing listens on (just now).
func freeAddr() string {
	a, err := testenv.FreeAddr()
	if err != nil {
		panic(err)
	}
	return a
}
