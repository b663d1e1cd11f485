package runtimetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testSnapshot: a backend that takes snapshots (VolumeCapturer and SnapshotCache, and
// no Support.NoSnapshots) captures a running sandbox's scratch volume as an archive,
// and a new sandbox whose volume restores that archive starts with its content.
func testSnapshot(t *testing.T, s *suite) {
	b := s.newBackend(t)
	vc, ok1 := b.(runtime.VolumeCapturer)
	sc, ok2 := b.(runtime.SnapshotCache)
	if !ok1 || !ok2 {
		t.Skip("the backend takes no file-system snapshots")
	}
	if sr, ok := b.(runtime.SupportReporter); ok && sr.Support().NoSnapshots {
		t.Skip("the backend reports NoSnapshots")
	}
	src := s.spec("snap", "sh", "-c", "mkdir -p /data/d && echo kept > /data/d/f && touch /data/ready && exec sleep 3600")
	src.Volumes = []runtime.Volume{{Name: "data"}}
	src.VolumeMounts = []runtime.VolumeMount{{Volume: "data", Path: "/data"}}
	s.create(t, b, src)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if out, _ := execIn(t, b, src.ID, "sh", "-c", "test -f /data/ready && echo y"); strings.TrimSpace(out) == "y" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox did not write its volume")
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx := context.Background()
	c, err := vc.CaptureVolume(ctx, src.ID, "data")
	if err != nil {
		t.Fatalf("CaptureVolume: %v", err)
	}
	defer func() { _ = c.Close() }()
	var buf bytes.Buffer
	st, err := c.WriteArchive(ctx, &buf)
	if err != nil {
		t.Fatalf("WriteArchive: %v", err)
	}
	if st.Files < 3 || st.Bytes != int64(len("kept\n")) {
		t.Errorf("ArchiveStats = %+v, want >= 3 entries and %d bytes", st, len("kept\n"))
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	sum := sha256.Sum256(buf.Bytes())
	digest := hex.EncodeToString(sum[:])
	if err := sc.PrepareSnapshot(ctx, digest, runtime.ArchiveLimits{}, func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}); err != nil {
		t.Fatalf("PrepareSnapshot: %v", err)
	}
	dst := s.spec("restored", "sleep", "3600")
	dst.Volumes = []runtime.Volume{{Name: "data", RestoreDigest: digest}}
	dst.VolumeMounts = []runtime.VolumeMount{{Volume: "data", Path: "/data"}}
	s.create(t, b, dst)
	if out, _ := execIn(t, b, dst.ID, "cat", "/data/d/f"); out != "kept\n" {
		t.Errorf("restored volume: d/f = %q, want %q", out, "kept\n")
	}
}
