package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandboxd/sandboxd/internal/release"
)

// `sandboxd release` is the release publisher's tooling for signed release manifests
// (docs/admin.md "Signed release manifests"): it runs on the operator's machine, where
// the signing key stays; the control plane and the runners only ever see the public key.

const (
	releaseKeyFile = "release-signing.key"
	releasePubFile = "release-signing.pub"
)

const releaseUsage = `usage: sandboxd release <command> [flags]

  keygen   --out DIR                write DIR/release-signing.key (0600) and DIR/release-signing.pub
  manifest --version V --runner-image-digest D --agent-image-digest D [--binary ARCH=PATH]… [--agent ARCH=PATH]… [--out FILE]
           print a release manifest, with the SHA-256 of the binaries
  sign     --key KEY --manifest M [--out M.sig]
           sign manifest M (its bytes as they are); the signature is base64
  verify   --keys PUB --manifest M --signature S
           check M.sig against the public keys and print the release it describes
`

// releaseCmd dispatches `sandboxd release`, writing what it prints to stdout.
func releaseCmd(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(strings.TrimSpace(releaseUsage))
	}
	fs := flag.NewFlagSet("release "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "keygen":
		out := fs.String("out", "", "directory to write "+releaseKeyFile+" and "+releasePubFile+" to (created 0700 if missing)")
		if err := parseArgs(fs, args[1:]); err != nil {
			return err
		}
		if *out == "" {
			return errors.New("release keygen: --out DIR is required")
		}
		return releaseKeygen(*out, stdout)
	case "manifest":
		var m release.Manifest
		var bins, agents listFlag
		out := fs.String("out", "", "file to write the manifest to (default: standard output)")
		fs.StringVar(&m.Version, "version", "", "the release's version, as its runners report it (e.g. v1.4.0)")
		fs.StringVar(&m.RunnerImageDigest, "runner-image-digest", "", "the runner image's digest (sha256:…)")
		fs.StringVar(&m.AgentImageDigest, "agent-image-digest", "", "the sandbox-agent image's digest (sha256:…)")
		fs.Var(&bins, "binary", "ARCH=PATH of the sandboxd binary for GOARCH ARCH (repeatable)")
		fs.Var(&agents, "agent", "ARCH=PATH of the sandbox-agent binary for ARCH (repeatable; needs --binary ARCH)")
		if err := parseArgs(fs, args[1:]); err != nil {
			return err
		}
		b, err := buildManifest(m, bins, agents)
		if err != nil {
			return err
		}
		if *out == "" {
			_, err = stdout.Write(b)
			return err
		}
		return os.WriteFile(*out, b, 0o644)
	case "sign":
		key := fs.String("key", "", "the signing key ("+releaseKeyFile+" from keygen)")
		manifest := fs.String("manifest", "", "the manifest to sign")
		out := fs.String("out", "", "where to write the signature (default MANIFEST.sig)")
		if err := parseArgs(fs, args[1:]); err != nil {
			return err
		}
		if *key == "" || *manifest == "" {
			return errors.New("release sign: --key and --manifest are required")
		}
		if *out == "" {
			*out = *manifest + ".sig"
		}
		return releaseSign(*key, *manifest, *out, stdout)
	case "verify":
		keys := fs.String("keys", "", "PEM file of the trusted public keys (as for controlplane --release-keys)")
		manifest := fs.String("manifest", "", "the manifest")
		sig := fs.String("signature", "", "its signature (default MANIFEST.sig)")
		if err := parseArgs(fs, args[1:]); err != nil {
			return err
		}
		if *keys == "" || *manifest == "" {
			return errors.New("release verify: --keys and --manifest are required")
		}
		if *sig == "" {
			*sig = *manifest + ".sig"
		}
		return releaseVerify(*keys, *manifest, *sig, stdout)
	}
	return fmt.Errorf("release: unknown command %q\n%s", args[0], strings.TrimSpace(releaseUsage))
}

func parseArgs(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w\n%s", fs.Name(), err, strings.TrimSpace(releaseUsage))
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// releaseKeygen writes a new Ed25519 key pair into dir, refusing to replace either file:
// losing a signing key someone trusts is worse than a failed command.
func releaseKeygen(dir string, stdout io.Writer) error {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	keyPath, pubPath := filepath.Join(dir, releaseKeyFile), filepath.Join(dir, releasePubFile)
	for _, p := range []string{keyPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("release keygen: %s exists; not replacing a key (remove it, or use another --out)", p)
		}
	}
	if err := writeNew(keyPath, release.MarshalPrivateKey(priv), 0o600); err != nil {
		return err
	}
	if err := writeNew(pubPath, release.MarshalPublicKey(pub), 0o644); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "wrote %s (keep it on this machine) and %s (give it to the control plane: --release-keys)\n", keyPath, pubPath)
	return err
}

// writeNew creates path with data, failing if it exists.
func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// buildManifest fills m's binaries from the files named ARCH=PATH and returns the
// manifest as it will be signed: indented JSON and a newline.
func buildManifest(m release.Manifest, bins, agents []string) ([]byte, error) {
	sums := func(flagName string, specs []string) (map[string]string, error) {
		out := map[string]string{}
		for _, s := range specs {
			arch, path, ok := strings.Cut(s, "=")
			if !ok || arch == "" || path == "" {
				return nil, fmt.Errorf("--%s %q: want ARCH=PATH", flagName, s)
			}
			if _, dup := out[arch]; dup {
				return nil, fmt.Errorf("--%s: %s given twice", flagName, arch)
			}
			sum, err := fileSHA256(path)
			if err != nil {
				return nil, fmt.Errorf("--%s %s: %w", flagName, arch, err)
			}
			out[arch] = sum
		}
		return out, nil
	}
	b, err := sums("binary", bins)
	if err != nil {
		return nil, err
	}
	a, err := sums("agent", agents)
	if err != nil {
		return nil, err
	}
	for arch := range a {
		if _, ok := b[arch]; !ok {
			return nil, fmt.Errorf("--agent %s needs --binary %s: a manifest lists an architecture's sandboxd binary with its agent", arch, arch)
		}
	}
	for arch, sum := range b {
		if m.Binaries == nil {
			m.Binaries = map[string]release.Binaries{}
		}
		m.Binaries[arch] = release.Binaries{Sandboxd: sum, Agent: a[arch]}
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// releaseSign signs the manifest file's bytes, after checking that they are a valid
// manifest (a signature on anything else would be refused by every verifier anyway).
func releaseSign(keyPath, manifestPath, out string, stdout io.Writer) error {
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return err
	}
	key, err := release.ParsePrivateKey(keyPEM)
	if err != nil {
		return fmt.Errorf("%s: %w", keyPath, err)
	}
	data, err := os.ReadFile(manifestPath)
	if err != nil {
		return err
	}
	m, err := release.ParseManifest(data)
	if err != nil {
		return fmt.Errorf("%s: %w", manifestPath, err)
	}
	if err := os.WriteFile(out, release.EncodeSignature(release.Sign(key, data)), 0o644); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "signed release %s: %s\n", m.Version, out)
	return err
}

func releaseVerify(keysPath, manifestPath, sigPath string, stdout io.Writer) error {
	keys, err := loadReleaseKeys(keysPath)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(manifestPath)
	if err != nil {
		return err
	}
	sigData, err := os.ReadFile(sigPath)
	if err != nil {
		return err
	}
	sig, err := release.DecodeSignature(sigData)
	if err != nil {
		return fmt.Errorf("%s: %w", sigPath, err)
	}
	m, err := release.Verify(keys, data, sig)
	if err != nil {
		return fmt.Errorf("%s: %w", manifestPath, err)
	}
	_, err = fmt.Fprintf(stdout, "good signature: release %s (runner image %s, agent image %s, %d architectures)\n",
		m.Version, m.RunnerImageDigest, m.AgentImageDigest, len(m.Binaries))
	return err
}

// loadReleaseKeys reads a PEM file of trusted release public keys (--release-keys).
func loadReleaseKeys(path string) ([]ed25519.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	keys, err := release.ParsePublicKeys(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, nil
}
