package release

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
)

const goodManifest = `{"version":"v1.2.0",` +
	`"runner_image_digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111",` +
	`"agent_image_digest":"sha256:2222222222222222222222222222222222222222222222222222222222222222",` +
	`"binaries":{"amd64":{"sandboxd":"3333333333333333333333333333333333333333333333333333333333333333",` +
	`"sandbox_agent":"4444444444444444444444444444444444444444444444444444444444444444"}}}`

func newKey(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func TestManifestSignVerify(t *testing.T) {
	pub, priv := newKey(t)
	otherPub, otherPriv := newKey(t)
	data := []byte(goodManifest)
	sig := Sign(priv, data)

	m, err := Verify([]ed25519.PublicKey{otherPub, pub}, data, sig)
	if err != nil {
		t.Fatalf("Verify with the signer among the keys: %v", err)
	}
	if m.Version != "v1.2.0" || m.Binaries["amd64"].Agent != strings.Repeat("4", 64) {
		t.Fatalf("parsed manifest = %+v", m)
	}

	tampered := bytes.Replace(data, []byte("3333"), []byte("3334"), 1)
	for name, tc := range map[string]struct {
		keys      []ed25519.PublicKey
		data, sig []byte
	}{
		"other key only":    {[]ed25519.PublicKey{otherPub}, data, sig},
		"no keys":           {nil, data, sig},
		"tampered manifest": {[]ed25519.PublicKey{pub}, tampered, sig},
		"signed by another": {[]ed25519.PublicKey{pub}, data, Sign(otherPriv, data)},
		"short signature":   {[]ed25519.PublicKey{pub}, data, sig[:10]},
		"bare signature over the bytes, no context": {[]ed25519.PublicKey{pub}, data, ed25519.Sign(priv, data)},
	} {
		if _, err := Verify(tc.keys, tc.data, tc.sig); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: Verify = %v, want ErrBadSignature", name, err)
		}
	}
}

func TestManifestVerifyRefusesInvalidSignedManifest(t *testing.T) {
	pub, priv := newKey(t)
	bad := []byte(`{"version":"1.0","runner_image_digest":"x","agent_image_digest":"y"}`)
	_, err := Verify([]ed25519.PublicKey{pub}, bad, Sign(priv, bad))
	var me ManifestError
	if !errors.As(err, &me) || len(me) != 3 {
		t.Fatalf("Verify of a signed but invalid manifest = %v, want 3 field errors", err)
	}
}

func TestParseManifestStrict(t *testing.T) {
	for name, in := range map[string]string{
		"unknown field":   strings.Replace(goodManifest, `"version"`, `"extra":1,"version"`, 1),
		"trailing data":   goodManifest + `{}`,
		"not JSON":        `version: v1`,
		"bad arch":        strings.Replace(goodManifest, `"amd64"`, `"vax"`, 1),
		"bad checksum":    strings.Replace(goodManifest, strings.Repeat("3", 64), "33", 1),
		"missing digests": `{"version":"v1.0.0"}`,
		"too big":         `{"version":"` + strings.Repeat("x", MaxManifestBytes) + `"}`,
	} {
		if _, err := ParseManifest([]byte(in)); err == nil {
			t.Errorf("%s: ParseManifest accepted it", name)
		}
	}
	m, err := ParseManifest([]byte(strings.Replace(goodManifest, `,"sandbox_agent":"`+strings.Repeat("4", 64)+`"`, "", 1)))
	if err != nil || m.Binaries["amd64"].Agent != "" {
		t.Fatalf("a manifest without an agent checksum: %+v, %v", m, err)
	}
}

func TestKeysRoundTrip(t *testing.T) {
	pub, priv := newKey(t)
	pub2, _ := newKey(t)
	keys, err := ParsePublicKeys(append(MarshalPublicKey(pub), MarshalPublicKey(pub2)...))
	if err != nil || len(keys) != 2 || !keys[0].Equal(pub) || !keys[1].Equal(pub2) {
		t.Fatalf("ParsePublicKeys = %v, %v", keys, err)
	}
	got, err := ParsePrivateKey(MarshalPrivateKey(priv))
	if err != nil || !got.Equal(priv) {
		t.Fatalf("ParsePrivateKey = %v", err)
	}
	for name, in := range map[string][]byte{
		"empty":         nil,
		"private key":   MarshalPrivateKey(priv),
		"garbage after": append(MarshalPublicKey(pub), "junk"...),
		"too many":      bytes.Repeat(MarshalPublicKey(pub), MaxPublicKeys+1),
	} {
		if _, err := ParsePublicKeys(in); err == nil {
			t.Errorf("%s: ParsePublicKeys accepted it", name)
		}
	}
	if _, err := ParsePrivateKey(MarshalPublicKey(pub)); err == nil {
		t.Error("ParsePrivateKey accepted a public key")
	}
}

func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(goodManifest))
	f.Add([]byte(`{"version":"v1.0.0","binaries":{"arm64":{}}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(data)
		if err != nil {
			return
		}
		if verr := m.Validate(); verr != nil {
			t.Fatalf("ParseManifest accepted a manifest Validate refuses: %v", verr)
		}
	})
}

func TestSignatureEncoding(t *testing.T) {
	_, priv := newKey(t)
	sig := Sign(priv, []byte(goodManifest))
	enc := EncodeSignature(sig)
	if len(enc) != 89 || enc[88] != '\n' {
		t.Fatalf("encoded %q", enc)
	}
	for name, in := range map[string][]byte{
		"base64":             enc,
		"base64, no newline": bytes.TrimSpace(enc),
		"base64, CRLF":       append(bytes.TrimSpace(enc), '\r', '\n'),
		"raw":                sig,
	} {
		if got, err := DecodeSignature(in); err != nil || !bytes.Equal(got, sig) {
			t.Errorf("%s: %x %v", name, got, err)
		}
	}
	for name, in := range map[string][]byte{
		"empty":          nil,
		"short base64":   EncodeSignature(sig[:63]),
		"long base64":    EncodeSignature(append(sig, 0)),
		"not base64":     bytes.Repeat([]byte("!"), 88),
		"raw, 65 bytes":  append(bytes.Clone(sig), 0),
		"two signatures": append(bytes.Clone(enc), enc...),
	} {
		if got, err := DecodeSignature(in); err == nil {
			t.Errorf("%s: decoded %x", name, got)
		}
	}
}

// A manifest reads the same to a reviewer and to the parser: no duplicate keys (JSON
// decoders keep the last), no keys in another case (encoding/json would match them).
func TestParseManifestRefusesAmbiguousKeys(t *testing.T) {
	for name, data := range map[string]string{
		"duplicate version": strings.Replace(goodManifest, `{"version":"v1.2.0",`, `{"version":"v1.2.0","version":"v9.0.0",`, 1),
		"Version":           strings.Replace(goodManifest, `"version"`, `"Version"`, 1),
		"RUNNER digest":     strings.Replace(goodManifest, `"runner_image_digest"`, `"RUNNER_IMAGE_DIGEST"`, 1),
		"duplicate arch": strings.Replace(goodManifest, `"binaries":{`,
			`"binaries":{"amd64":{"sandboxd":"`+strings.Repeat("5", 64)+`"},`, 1),
		"duplicate sandboxd": strings.Replace(goodManifest, `{"sandboxd":`, `{"sandboxd":"`+strings.Repeat("5", 64)+`","sandboxd":`, 1),
		"Sandboxd":           strings.Replace(goodManifest, `{"sandboxd":`, `{"Sandboxd":`, 1),
	} {
		if m, err := ParseManifest([]byte(data)); err == nil {
			t.Errorf("%s: accepted %+v", name, m)
		}
	}
	if _, err := ParseManifest([]byte(goodManifest)); err != nil {
		t.Fatal(err)
	}
}
