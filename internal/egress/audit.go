package egress

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// DefaultAuditMaxBytes bounds the audit log file before it is rotated.
const DefaultAuditMaxBytes = 16 << 20

// AuditEntry is one use (or refused use) of an injected secret. It never holds a value.
type AuditEntry struct {
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	Org     string    `json:"org"`
	Source  string    `json:"source"`           // the sandbox's address
	Host    string    `json:"host"`             // the TLS server name
	Secret  string    `json:"secret,omitempty"` // store/path[#field] (comma-separated for a refused request)
	Header  string    `json:"header,omitempty"`
	Result  string    `json:"result"` // "injected" or "refused: <why>"
}

// AuditLog appends AuditEntries as JSON lines to a file; when the file would pass
// MaxBytes it is renamed to <path>.1 (replacing the previous one) and a new one begun, so
// at most twice MaxBytes are kept. A nil *AuditLog records nothing.
type AuditLog struct {
	Path     string
	MaxBytes int64 // 0: DefaultAuditMaxBytes
	// Errorf reports write failures (nil: ignored).
	Errorf func(format string, args ...any)

	mu   sync.Mutex
	f    *os.File
	size int64
}

// Record appends e (its Time set now when zero).
func (a *AuditLog) Record(e AuditEntry) {
	if a == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	b, err := json.Marshal(&e)
	if err != nil {
		return
	}
	b = append(b, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.write(b); err != nil && a.Errorf != nil {
		a.Errorf("egress audit log %s: %v", a.Path, err)
	}
}

func (a *AuditLog) write(b []byte) error {
	max := a.MaxBytes
	if max <= 0 {
		max = DefaultAuditMaxBytes
	}
	if a.f != nil && a.size+int64(len(b)) > max {
		_ = a.f.Close()
		a.f = nil
		if err := os.Rename(a.Path, a.Path+".1"); err != nil {
			return fmt.Errorf("rotate: %w", err)
		}
	}
	if a.f == nil {
		if err := os.MkdirAll(filepath.Dir(a.Path), 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(a.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		st, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return err
		}
		a.f, a.size = f, st.Size()
		if a.size+int64(len(b)) > max && a.size > 0 {
			// Left over from before a restart and full: rotate now.
			_ = a.f.Close()
			a.f = nil
			if err := os.Rename(a.Path, a.Path+".1"); err != nil {
				return fmt.Errorf("rotate: %w", err)
			}
			return a.write(b)
		}
	}
	n, err := a.f.Write(b)
	a.size += int64(n)
	return err
}

// Close closes the file.
func (a *AuditLog) Close() error {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return nil
	}
	err := a.f.Close()
	a.f = nil
	return err
}
