package network

import (
	"crypto/x509"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/egress"
)

// Egress secrets (docs/secrets.md, "Secrets that never enter the sandbox"): the egress
// proxy intercepts a sandbox's TLS to the hosts its rules attach secrets to.

// AuditFile is the egress secrets' audit log in the network state dir
// (egress.AuditLog: JSON lines, rotated to AuditFile.1).
const AuditFile = "egress-audit.jsonl"

// SetEgressSecrets hands the egress proxy the secrets of the sandbox whose attachment
// is id (Setup first). They live in memory only: a restarted runner has none, and the
// proxy refuses that sandbox's connections to those hosts (Secrets).
func (m *Manager) SetEgressSecrets(id string, ss *egress.SandboxSecrets) error {
	if err := validID(id); err != nil {
		return err
	}
	att, err := m.readRecord(id)
	if err != nil {
		return fmt.Errorf("network: egress secrets of %s: %w", id, err)
	}
	if ss == nil {
		m.secrets.Delete(att.IP)
		return nil
	}
	m.secrets.Store(att.IP, ss)
	return nil
}

// Secrets is what the egress proxy injects for the sandbox at src: what SetEgressSecrets
// gave, or, for a sandbox whose rules carry secrets the Manager was not given (a runner
// restarted since its create), a record that refuses its connections to those hosts.
func (m *Manager) Secrets(src netip.Addr) *egress.SandboxSecrets {
	src = src.Unmap()
	if v, ok := m.secrets.Load(src); ok {
		return v.(*egress.SandboxSecrets)
	}
	if v, ok := m.pol.injectHosts.Load(src); ok {
		return egress.LostSecrets("", "", v.([]string))
	}
	return nil
}

// forgetSecrets drops the secrets of the sandbox at ip (Teardown).
func (m *Manager) forgetSecrets(ip netip.Addr) {
	if ip.IsValid() {
		m.secrets.Delete(ip)
	}
}

// upstreamRoots reads Config.EgressUpstreamCAFile (nil: the system roots).
func (m *Manager) upstreamRoots() (*x509.CertPool, error) {
	pool, err := egress.ReadUpstreamRoots(m.cfg.EgressUpstreamCAFile)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	return pool, nil
}

// auditLog is the egress secrets' audit log.
func (m *Manager) auditLog() *egress.AuditLog {
	return &egress.AuditLog{Path: filepath.Join(m.stateDir, AuditFile)}
}
