package network

import (
	"net/netip"
	"testing"

	"github.com/sandboxd/sandboxd/internal/egress"
)

// TestSecretsAfterRestart: a sandbox whose rules carry egress secrets the Manager was not
// given (a restarted runner: rules restored from disk, values gone) gets a record that
// makes the proxy refuse its connections to those hosts; one it was given gets its own.
func TestSecretsAfterRestart(t *testing.T) {
	var m Manager
	m.pol.members = map[netip.Addr]*member{}
	ip := netip.MustParseAddr("10.1.2.3")
	if m.Secrets(ip) != nil {
		t.Fatal("secrets for a sandbox without rules")
	}
	m.pol.set(ip, &member{grants: []string{"api.example.com", "b.example.com"}, inject: []string{"api.example.com"}})
	lost := m.Secrets(netip.MustParseAddr("::ffff:10.1.2.3"))
	if lost == nil || !lost.Lost || len(lost.Hosts) != 1 || lost.Hosts[0] != "api.example.com" {
		t.Fatalf("after a restart: %+v", lost)
	}
	ss := egress.LostSecrets("sbx", "org", nil)
	ss.Lost = false
	m.secrets.Store(ip, ss)
	if m.Secrets(ip) != ss {
		t.Fatal("registered secrets not returned")
	}
	m.forgetSecrets(ip)
	m.pol.set(ip, nil)
	if m.Secrets(ip) != nil {
		t.Fatal("secrets after teardown")
	}
}
