package release

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/internal/textclip"
)

// A release manifest is a release as its publisher signs it: a small JSON document naming
// the version, the runner and agent image digests and, per architecture, the SHA-256 of
// the sandboxd and sandbox-agent binaries. The signature is Ed25519 over a fixed context
// string followed by the manifest's bytes exactly as published: there is no
// canonicalization, so a verifier checks the very bytes it received and then parses them.
// Whoever holds the manifest and its signature (the control plane, a single-host runner)
// can check them against the publisher's public keys without trusting whoever relayed them.

// MaxManifestBytes bounds a manifest; MaxSignatureBytes its signature as sent (raw).
const (
	MaxManifestBytes  = 16 << 10
	MaxSignatureBytes = ed25519.SignatureSize
	// MaxPublicKeys bounds the keys one trust file may hold.
	MaxPublicKeys = 16
)

// signingContext is prepended to the manifest's bytes before signing, so a signature
// over a manifest is never valid for anything else the same key might sign.
const signingContext = "sandboxd release manifest v1\n"

// Manifest is a parsed release manifest.
type Manifest struct {
	Version           string `json:"version"`
	RunnerImageDigest string `json:"runner_image_digest"`
	AgentImageDigest  string `json:"agent_image_digest"`
	// Binaries: GOARCH -> the checksums of that architecture's binaries. Optional: a
	// release may ship images only.
	Binaries map[string]Binaries `json:"binaries,omitempty"`
}

// Binaries are the hex SHA-256 checksums of one architecture's binaries.
type Binaries struct {
	Sandboxd string `json:"sandboxd"`
	// Agent (sandbox-agent) is optional: a runner keeps its agent when absent.
	Agent string `json:"sandbox_agent,omitempty"`
}

// FieldError is one violated field of a manifest ("binaries[\"amd64\"].sandboxd").
type FieldError struct {
	Field, Problem string
}

func (e FieldError) Error() string { return e.Field + ": " + e.Problem }

// ManifestError lists every violated field of a manifest.
type ManifestError []FieldError

func (e ManifestError) Error() string {
	if len(e) == 1 {
		return "invalid release manifest: " + e[0].Error()
	}
	return fmt.Sprintf("invalid release manifest: %s (and %d more)", e[0].Error(), len(e)-1)
}

// Validate checks every field and returns a ManifestError naming each violation.
func (m Manifest) Validate() error {
	var errs ManifestError
	if _, err := ParseVersion(m.Version); err != nil {
		errs = append(errs, FieldError{"version", err.Error()})
	}
	if err := CheckDigest(m.RunnerImageDigest); err != nil {
		errs = append(errs, FieldError{"runner_image_digest", err.Error()})
	}
	if err := CheckDigest(m.AgentImageDigest); err != nil {
		errs = append(errs, FieldError{"agent_image_digest", err.Error()})
	}
	for _, arch := range slices.Sorted(maps.Keys(m.Binaries)) {
		field := fmt.Sprintf("binaries[%q]", textclip.Clip(arch, 80))
		if err := CheckArch(arch); err != nil {
			errs = append(errs, FieldError{field, err.Error()})
			continue
		}
		b := m.Binaries[arch]
		if err := CheckChecksum(b.Sandboxd); err != nil {
			errs = append(errs, FieldError{field + ".sandboxd", err.Error()})
		}
		if b.Agent != "" {
			if err := CheckChecksum(b.Agent); err != nil {
				errs = append(errs, FieldError{field + ".sandbox_agent", err.Error()})
			}
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// ParseManifest parses a manifest strictly (one JSON object, no unknown fields, at most
// MaxManifestBytes) and validates it. It does not check any signature: use Verify for
// bytes that came from anyone but yourself.
func ParseManifest(data []byte) (Manifest, error) {
	if len(data) > MaxManifestBytes {
		return Manifest{}, fmt.Errorf("release manifest is %d bytes; at most %d", len(data), MaxManifestBytes)
	}
	// encoding/json takes the last of duplicate keys and matches keys case-insensitively:
	// a reviewer reading the first "version" before signing, or "Version", would see
	// another release than the one verified. So a manifest's keys must be unique and
	// spelled exactly.
	if err := checkKeys(data); err != nil {
		return Manifest{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("release manifest is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Manifest{}, errors.New("release manifest has data after its JSON object")
	}
	if err := m.Validate(); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// manifestKeys and binariesKeys are a manifest's keys, spelled exactly: its top-level
// object's and those of each architecture's object in binaries.
var (
	manifestKeys = []string{"version", "runner_image_digest", "agent_image_digest", "binaries"}
	binariesKeys = []string{"sandboxd", "sandbox_agent"}
)

// checkKeys refuses a duplicate key in any object of data, and a key of the manifest or of
// a binaries entry that is not spelled exactly. Malformed JSON is left to the decoder.
func checkKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	// walk reads one value whose first token is tok; path names its object ("" top-level,
	// "binaries", "binaries.<arch>").
	var walk func(tok json.Token, path string, depth int) error
	walk = func(tok json.Token, path string, depth int) error {
		if depth > 8 {
			return errors.New("release manifest: nested too deep")
		}
		switch tok {
		case json.Delim('['):
			for dec.More() {
				t, err := dec.Token()
				if err != nil {
					return nil
				}
				if err := walk(t, path+"[]", depth+1); err != nil {
					return err
				}
			}
			_, _ = dec.Token()
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil
				}
				k, _ := kt.(string)
				if seen[k] {
					return fmt.Errorf("release manifest: key %q appears twice in %s", textclip.Clip(k, 80), objectName(path))
				}
				seen[k] = true
				var want []string
				switch {
				case path == "":
					want = manifestKeys
				case strings.HasPrefix(path, "binaries.") && strings.Count(path, ".") == 1:
					want = binariesKeys
				}
				if want != nil && !slices.Contains(want, k) {
					return fmt.Errorf("release manifest: unknown key %q in %s (keys are %s, spelled exactly)", textclip.Clip(k, 80), objectName(path), strings.Join(want, ", "))
				}
				vt, err := dec.Token()
				if err != nil {
					return nil
				}
				child := k
				if path != "" {
					child = path + "." + k
				}
				if err := walk(vt, child, depth+1); err != nil {
					return err
				}
			}
			_, _ = dec.Token()
		}
		return nil
	}
	tok, err := dec.Token()
	if err != nil {
		return nil
	}
	return walk(tok, "", 0)
}

func objectName(path string) string {
	if path == "" {
		return "the manifest"
	}
	return textclip.Clip(path, 80)
}

// ErrBadSignature: no trusted key signed these manifest bytes.
var ErrBadSignature = errors.New("the release manifest's signature does not verify with any trusted key")

// Sign signs a manifest's bytes (as they will be published) with key.
func Sign(key ed25519.PrivateKey, manifest []byte) []byte {
	return ed25519.Sign(key, signed(manifest))
}

// Verify checks that one of keys signed manifest, then parses it. Nothing is parsed
// before the signature verifies.
func Verify(keys []ed25519.PublicKey, manifest, signature []byte) (Manifest, error) {
	if len(manifest) > MaxManifestBytes {
		return Manifest{}, fmt.Errorf("release manifest is %d bytes; at most %d", len(manifest), MaxManifestBytes)
	}
	if len(signature) != ed25519.SignatureSize {
		return Manifest{}, fmt.Errorf("%w: a signature is %d bytes (got %d)", ErrBadSignature, ed25519.SignatureSize, len(signature))
	}
	msg := signed(manifest)
	for _, k := range keys {
		if len(k) == ed25519.PublicKeySize && ed25519.Verify(k, msg, signature) {
			return ParseManifest(manifest)
		}
	}
	return Manifest{}, ErrBadSignature
}

func signed(manifest []byte) []byte {
	return append([]byte(signingContext), manifest...)
}

// ParsePublicKeys reads Ed25519 public keys from PEM ("PUBLIC KEY" blocks, PKIX), at
// least one and at most MaxPublicKeys. Any other block or key type is an error.
func ParsePublicKeys(data []byte) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return nil, errors.New("release keys: data that is not a PEM block")
			}
			break
		}
		if b.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("release keys: a %q PEM block; want PUBLIC KEY", textclip.Clip(b.Type, 80))
		}
		k, err := x509.ParsePKIXPublicKey(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("release keys: %w", err)
		}
		ek, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("release keys: a %T; want Ed25519", k)
		}
		if keys = append(keys, ek); len(keys) > MaxPublicKeys {
			return nil, fmt.Errorf("release keys: more than %d keys", MaxPublicKeys)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("release keys: no PUBLIC KEY PEM block")
	}
	return keys, nil
}

// MarshalPublicKey encodes key as a PEM "PUBLIC KEY" block.
func MarshalPublicKey(key ed25519.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		panic(err) // an Ed25519 key always marshals
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// MarshalPrivateKey encodes key as a PEM "PRIVATE KEY" block (PKCS #8).
func MarshalPrivateKey(key ed25519.PrivateKey) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		panic(err) // an Ed25519 key always marshals
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// ParsePrivateKey reads one Ed25519 private key (PEM "PRIVATE KEY", PKCS #8).
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("release signing key: want a PEM PRIVATE KEY block (PKCS #8)")
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("release signing key: %w", err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("release signing key: a %T; want Ed25519", k)
	}
	return ek, nil
}

// EncodeSignature is a signature as `sandboxd release sign` writes it: standard base64 and
// a newline, so it can be pasted, mailed and diffed like the manifest.
func EncodeSignature(sig []byte) []byte {
	return []byte(base64.StdEncoding.EncodeToString(sig) + "\n")
}

// DecodeSignature reads a signature file: the raw 64 bytes (what signing tools such as
// `openssl pkeyutl -rawin` write) or their base64 (EncodeSignature), surrounding white
// space ignored. Raw is recognized by its length: base64 of 64 bytes is 88 characters.
func DecodeSignature(data []byte) ([]byte, error) {
	if len(data) == ed25519.SignatureSize {
		return bytes.Clone(data), nil
	}
	text := bytes.TrimSpace(data)
	if len(text) > base64.StdEncoding.EncodedLen(ed25519.SignatureSize) {
		return nil, fmt.Errorf("release signature: %d bytes; want %d raw or their base64", len(data), ed25519.SignatureSize)
	}
	sig, err := base64.StdEncoding.DecodeString(string(text))
	if err != nil {
		return nil, fmt.Errorf("release signature: neither %d raw bytes nor base64: %w", ed25519.SignatureSize, err)
	}
	if len(sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("release signature: %d bytes; want %d", len(sig), ed25519.SignatureSize)
	}
	return sig, nil
}
