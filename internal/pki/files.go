package pki

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// WriteKeyPair writes cert's chain to dir/name.pem (0644) and its private key to
// dir/name-key.pem (0600, PKCS#8), each atomically (dir is created 0700 if missing).
func WriteKeyPair(dir, name string, cert tls.Certificate) error {
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		return errors.New("pki: WriteKeyPair: certificate or key missing")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	chain, keyPEM, err := EncodeKeyPair(cert)
	if err != nil {
		return err
	}
	certPath, keyPath := keyPairPaths(dir, name)
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(certPath, chain, 0o644)
}

// EncodeKeyPair is cert's chain and its private key (PKCS#8) in PEM: what WriteKeyPair
// writes, for a caller that stores them elsewhere (tls.X509KeyPair reads them back).
func EncodeKeyPair(cert tls.Certificate) (chainPEM, keyPEM []byte, err error) {
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		return nil, nil, errors.New("pki: EncodeKeyPair: certificate or key missing")
	}
	if keyPEM, err = encodeKey(cert.PrivateKey); err != nil {
		return nil, nil, err
	}
	for _, der := range cert.Certificate {
		chainPEM = append(chainPEM, encodeCert(der)...)
	}
	return chainPEM, keyPEM, nil
}

// LoadKeyPair loads what WriteKeyPair wrote (Leaf set).
func LoadKeyPair(dir, name string) (tls.Certificate, error) {
	certPath, keyPath := keyPairPaths(dir, name)
	c, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: load %s: %w", certPath, err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return tls.Certificate{}, fmt.Errorf("pki: %s: %w", certPath, err)
		}
	}
	return c, nil
}

func keyPairPaths(dir, name string) (certPath, keyPath string) {
	return filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key crypto.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

func parseKey(b []byte) (crypto.Signer, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM private key")
		}
		var (
			k   any
			err error
		)
		switch blk.Type {
		case "PRIVATE KEY":
			k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(blk.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, err
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("unsupported key type %T", k)
		}
		return s, nil
	}
}

// writeFileAtomic writes data to p with mode perm via a synced temp file in the
// same directory and a rename, so readers see the old file or the new one.
func writeFileAtomic(p string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(p)
	f, err := os.CreateTemp(dir, "."+filepath.Base(p)+".tmp-*") // created 0600
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err = os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if d, e := os.Open(dir); e == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
