package blob

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
)

// VerifyReader wraps r, the content of an object recorded with size bytes and hex sha256
// want: at r's end it returns io.EOF only when both match, else ErrCorrupt; a stream
// longer than size is ErrCorrupt as soon as it shows. Implementations return it from Get.
func VerifyReader(r io.ReadCloser, size int64, want string) io.ReadCloser {
	return &verifyReader{r: r, left: size, want: want, h: sha256.New()}
}

type verifyReader struct {
	r    io.ReadCloser
	left int64
	want string
	h    hash.Hash
	err  error
}

func (v *verifyReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.left -= int64(n)
	if v.left < 0 {
		v.err = fmt.Errorf("%w: longer than its recorded size", ErrCorrupt)
		return 0, v.err
	}
	if errors.Is(err, io.EOF) {
		switch got := hex.EncodeToString(v.h.Sum(nil)); {
		case v.left != 0:
			err = fmt.Errorf("%w: %d bytes short of its recorded size", ErrCorrupt, v.left)
		case got != v.want:
			err = fmt.Errorf("%w: sha256 %s, recorded %s", ErrCorrupt, got, v.want)
		}
		v.err = err
	} else if err != nil {
		v.err = err
	}
	return n, err
}

func (v *verifyReader) Close() error { return v.r.Close() }

// SizedReader wraps r for Put: with size >= 0 it returns ErrSizeMismatch when r gives
// more or fewer than size bytes, and hashes what passes (Sum). size -1 is unchecked.
type SizedReader struct {
	r    io.Reader
	size int64
	n    int64
	h    hash.Hash
}

// NewSizedReader returns a SizedReader over r.
func NewSizedReader(r io.Reader, size int64) *SizedReader {
	return &SizedReader{r: r, size: size, h: sha256.New()}
}

func (s *SizedReader) Read(p []byte) (int, error) {
	if s.size >= 0 && int64(len(p)) > s.size-s.n+1 {
		p = p[:s.size-s.n+1] // read at most one byte past size: enough to see "more"
	}
	n, err := s.r.Read(p)
	s.h.Write(p[:n])
	s.n += int64(n)
	if s.size >= 0 && s.n > s.size {
		return n, fmt.Errorf("%w: more than the declared %d bytes", ErrSizeMismatch, s.size)
	}
	if errors.Is(err, io.EOF) && s.size >= 0 && s.n != s.size {
		return n, fmt.Errorf("%w: %d bytes, declared %d", ErrSizeMismatch, s.n, s.size)
	}
	return n, err
}

// N is the number of bytes read so far.
func (s *SizedReader) N() int64 { return s.n }

// Sum is the hex sha256 of the bytes read so far.
func (s *SizedReader) Sum() string { return hex.EncodeToString(s.h.Sum(nil)) }
