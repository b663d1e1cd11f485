package sni

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"testing"

	"github.com/sandboxd/sandboxd/internal/sni/snitest"
)

func TestRead(t *testing.T) {
	withSNI := snitest.ClientHello(t, &tls.Config{ServerName: testName})
	noSNI := snitest.ClientHello(t, &tls.Config{InsecureSkipVerify: true})
	tls12 := snitest.ClientHello(t, &tls.Config{ServerName: "old.example", MaxVersion: tls.VersionTLS12})
	for _, tc := range []struct {
		name    string
		in      []byte
		sni     string
		wantErr error
	}{
		{"TLS 1.3 client", withSNI, testName, nil},
		{"no SNI", noSNI, "", nil},
		{"TLS 1.2 client", tls12, "old.example", nil},
		{"split over records", splitRecords(withSNI, 100), testName, nil},
		{"split in the handshake header", splitRecords(withSNI, 2), testName, nil},
		{"HTTP", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "", ErrNotTLS},
		{"empty", nil, "", io.EOF},
		{"truncated", withSNI[:len(withSNI)-1], "", io.ErrUnexpectedEOF},
		{"not a ClientHello", []byte{22, 3, 1, 0, 4, 2, 0, 0, 0}, "", ErrMalformed},
		{"empty record", []byte{22, 3, 1, 0, 0}, "", ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Bytes after the hello must stay unread: they belong to the spliced stream.
			in := tc.in
			if tc.wantErr == nil {
				in = append(append([]byte(nil), in...), "rest"...)
			}
			r := bytes.NewReader(in)
			raw, sni, err := Read(r)
			if !errors.Is(err, tc.wantErr) || sni != tc.sni {
				t.Fatalf("got %q, %v; want %q, %v", sni, err, tc.sni, tc.wantErr)
			}
			if err == nil && (!bytes.Equal(raw, tc.in) || r.Len() != len("rest")) {
				t.Errorf("read %d bytes (%d left), want exactly the %d of the hello", len(raw), r.Len(), len(tc.in))
			}
		})
	}
}

// splitRecords re-frames a one-record ClientHello into records of at most n payload bytes.
func splitRecords(rec []byte, n int) []byte {
	var out []byte
	for p := rec[5:]; len(p) > 0; {
		k := min(n, len(p))
		out = append(out, rec[0], rec[1], rec[2], byte(k>>8), byte(k))
		out = append(out, p[:k]...)
		p = p[k:]
	}
	return out
}

// FuzzRead: run with -fuzzminimizetime 50x; minimizing a 1.5 KiB hello otherwise
// takes the fuzzer minutes.
func FuzzRead(f *testing.F) {
	for _, cfg := range []*tls.Config{
		{ServerName: testName},
		{InsecureSkipVerify: true},
		{ServerName: "a.example", MaxVersion: tls.VersionTLS12, NextProtos: []string{"h2"}},
	} {
		rec := snitest.ClientHello(f, cfg)
		f.Add(rec)
		f.Add(splitRecords(rec, 7))
	}
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		raw, sni, err := Read(bytes.NewReader(in))
		if !bytes.Equal(raw, in[:len(raw)]) {
			t.Fatal("raw is not a prefix of the input")
		}
		if err != nil {
			if sni != "" {
				t.Fatalf("error %v with server name %q", err, sni)
			}
			return
		}
		if sni != "" && !ValidServerName(sni) {
			t.Fatalf("returned invalid server name %q", sni)
		}
	})
}

const testName = "8080-0123456789abcdef.r1.edge.test"
