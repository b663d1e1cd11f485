package logbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWriters: every write of concurrent writers lands whole while readers
// read (under -race, an unguarded buffer fails here).
func TestConcurrentWriters(t *testing.T) {
	const writers, lines = 8, 100
	var b Buffer
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				if n, err := fmt.Fprintf(&b, "w%d-%d\n", w, i); err != nil || n != len(fmt.Sprintf("w%d-%d\n", w, i)) {
					t.Errorf("write: %d, %v", n, err)
				}
				_ = b.String()
			}
		})
	}
	wg.Wait()
	got := b.String()
	if n := strings.Count(got, "\n"); n != writers*lines {
		t.Fatalf("%d lines, want %d", n, writers*lines)
	}
	for w := range writers {
		for i := range lines {
			if !strings.Contains(got, fmt.Sprintf("\nw%d-%d\n", w, i)) && !strings.HasPrefix(got, fmt.Sprintf("w%d-%d\n", w, i)) {
				t.Errorf("line w%d-%d missing or torn", w, i)
			}
		}
	}
}
