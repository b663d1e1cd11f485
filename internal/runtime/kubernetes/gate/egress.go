package gate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/atomicfile"
	"github.com/sandboxd/sandboxd/internal/egress/cabundle"
)

// Egress secrets (docs/secrets.md; the runner's internal/runtime/kubernetes egress.go):
// the sandbox's CA certificate (public; the sandbox Secret's item EgressCAFile) and the
// runner's public roots (its ConfigMap EgressRootsConfigMapName, item EgressRootsFile) are
// mounted in the gate container only, at EgressSrcDir. The gate's install writes ca.pem
// and bundle.pem (roots, then the CA) into the EgressDir emptyDir, which every workload
// container mounts read-only at /etc/sandboxd-egress (egress.CAMount). The CA's key is
// never in the Pod.
const (
	EgressSrcDir    = "/etc/sandbox-gate-egress"
	EgressDir       = "/sandbox-gate-egress-out"
	EgressCAFile    = "egress-ca.pem"
	EgressRootsFile = "roots.pem"
	// maxEgressPEM bounds each file read (a ConfigMap holds at most 1 MiB).
	maxEgressPEM = 1 << 20
)

// InstallEgressBundle writes dstDir/ca.pem (srcDir/EgressCAFile) and dstDir/bundle.pem
// (srcDir/EgressRootsFile, when there, then the CA: cabundle.Join, as the local backend's
// egress.Bundle), mode 0444, each replaced durably (atomicfile).
// Without srcDir/EgressCAFile it does nothing (a sandbox without egress secrets).
func InstallEgressBundle(srcDir, dstDir string) error {
	ca, err := readBounded(filepath.Join(srcDir, EgressCAFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	roots, err := readBounded(filepath.Join(srcDir, EgressRootsFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{"ca.pem", ca}, {"bundle.pem", cabundle.Join(roots, ca)}} {
		if err := atomicfile.WriteFile(filepath.Join(dstDir, f.name), f.data, 0o444); err != nil {
			return err
		}
	}
	return nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxEgressPEM+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxEgressPEM {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxEgressPEM)
	}
	return b, nil
}

// EgressRootsConfigMapPrefix begins the name of each runner's roots ConfigMap
// (EgressRootsConfigMapName).
const EgressRootsConfigMapPrefix = "sandboxd-egress-roots-"

// EgressRootsConfigMapName is the ConfigMap of the sandbox namespace holding runner
// runnerID's roots (item EgressRootsFile): one per runner, as several runners may share
// a namespace. The ID itself when it is a DNS label (lower-case letters, digits and '-',
// at most 63), else 16 hex digits of its SHA-256. The runner's Role names it
// (internal/install).
func EgressRootsConfigMapName(runnerID string) string {
	if dnsLabel(runnerID) {
		return EgressRootsConfigMapPrefix + runnerID
	}
	h := sha256.Sum256([]byte(runnerID))
	return EgressRootsConfigMapPrefix + hex.EncodeToString(h[:8])
}
