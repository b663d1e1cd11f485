package runner

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// podArchiveFake captures volumes as the Kubernetes backend does: live only
// (LiveCapturer), a GLOBAL writer's copy also once stopped (StoppedGlobalCapturer) when
// stopped is set, the archive made "in the Pod": data, with the statistics it claims.
type podArchiveFake struct {
	*runtimetest.Fake
	stopped bool
	data    []byte
	claims  runtime.ArchiveStats
	stream  func(io.Writer) error // instead of data
}

func (podArchiveFake) CapturesLive() bool             { return true }
func (f podArchiveFake) CapturesStoppedGlobals() bool { return f.stopped }
func (f podArchiveFake) CaptureVolume(context.Context, string, string) (runtime.VolumeCapture, error) {
	return podCapture{f}, nil
}

type podCapture struct{ f podArchiveFake }

func (podCapture) Pause() time.Duration { return 0 }
func (c podCapture) WriteArchive(_ context.Context, w io.Writer) (runtime.ArchiveStats, error) {
	if c.f.stream != nil {
		return c.f.claims, c.f.stream(w)
	}
	_, err := w.Write(c.f.data)
	return c.f.claims, err
}
func (podCapture) Close() error { return nil }

// TestCommitGlobalFromPod: a runner whose backend captures a stopped GLOBAL writer takes
// writers (one that captures only live sandboxes refuses them); the archive made in the
// sandbox's Pod is checked as it is uploaded: a valid one is committed with the runner's
// own count of its content (not what the Pod claims), one that is not an archive, or
// whose files exceed the volume's size whatever the Pod claims, is not committed and the
// previous generation stays.
func TestCommitGlobalFromPod(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("12345678"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	var good bytes.Buffer
	if _, err := fsarchive.Write(ctx, root, &good, fsarchive.IDMap{}); err != nil {
		t.Fatal(err)
	}
	root.Close()
	lie := runtime.ArchiveStats{Files: 1, Bytes: 1}

	store := openStore(t)
	newRunner := func(be runtime.Backend) *Runner {
		r, err := New(ctx, Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), Blobs: store})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	fake := func() *runtimetest.Fake { f := runtimetest.NewFake(); t.Cleanup(f.Close); return f }
	writer := globalSpec()
	writer.Container.VolumeMounts[0].ReadOnly = false
	writer.Volumes[0].Global.CommitGeneration = 1
	if err := newRunner(podArchiveFake{Fake: fake()}).checkGlobals(&writer); err == nil || !strings.Contains(err.Error(), "cannot upload a writer's copy") {
		t.Errorf("a live-only capturer took a writer: %v", err)
	}
	if err := newRunner(podArchiveFake{Fake: fake(), stopped: true}).checkGlobals(&writer); err != nil {
		t.Errorf("a stopped-writer capturer refused a writer: %v", err)
	}

	prefix := writer.Volumes[0].Global.BlobPrefix
	for _, c := range []struct {
		name string
		data []byte
		size int64
		want string // "" = committed
	}{
		{"not an archive", []byte("garbage from the Pod"), DefaultGlobalVolumeBytes, "not valid"},
		{"files over the size", good.Bytes(), 7, "more than its 7 bytes"},
		{"valid", good.Bytes(), DefaultGlobalVolumeBytes, ""},
	} {
		if err := WriteGlobalManifest(ctx, store, prefix, GlobalManifest{Generation: 0}); err != nil {
			t.Fatal(err)
		}
		r := newRunner(podArchiveFake{Fake: fake(), stopped: true, data: c.data, claims: lie})
		v := writer.Volumes[0]
		v.SizeBytes = c.size
		m, err := r.commitGlobal("sbx-1", v)
		got, rerr := ReadGlobalManifest(ctx, store, prefix)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if c.want != "" {
			if err == nil || !strings.Contains(err.Error(), c.want) || got.Generation != 0 {
				t.Errorf("%s: %v, generation %d; want %q and generation 0 kept", c.name, err, got.Generation, c.want)
			}
			if _, gerr := store.Get(ctx, GlobalArchiveKey(prefix, 1, "sbx-1")); gerr == nil {
				t.Errorf("%s: the refused archive is kept", c.name)
			}
			continue
		}
		if err != nil || got.Generation != 1 || m.ContentBytes != 8 || m.Files != 2 {
			t.Errorf("%s: %+v, %v (stored %+v); want generation 1 with the runner's count (8 bytes, 2 entries), not the Pod's %+v", c.name, m, err, got, lie)
		}
	}

	// An archive declaring a file far over the volume's size (a sparse file, all zeros:
	// it compresses to nothing, so the archive's own bound would let it stream for
	// long): refused at its header, and the capture is ended there, not read to its end.
	if err := WriteGlobalManifest(ctx, store, prefix, GlobalManifest{Generation: 0}); err != nil {
		t.Fatal(err)
	}
	var streamed int64
	huge := func(w io.Writer) error {
		zw, err := zstd.NewWriter(w)
		if err != nil {
			return err
		}
		tw := tar.NewWriter(zw)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755}); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "sparse", Mode: 0o644, Size: 1 << 40}); err != nil {
			return err
		}
		zeros := make([]byte, 1<<20)
		for streamed < 1<<40 {
			if _, err := tw.Write(zeros); err != nil {
				return err
			}
			if err := zw.Flush(); err != nil {
				return err
			}
			streamed += int64(len(zeros))
			if streamed > 4<<30 {
				return errors.New("the capture was not ended")
			}
		}
		return nil
	}
	r := newRunner(podArchiveFake{Fake: fake(), stopped: true, stream: huge, claims: lie})
	start := time.Now()
	_, err = r.commitGlobal("sbx-2", writer.Volumes[0])
	if err == nil || !strings.Contains(err.Error(), "more than its") || streamed > 64<<20 {
		t.Errorf("a 1 TiB sparse file: %v after %d bytes streamed (%s); want it refused at once", err, streamed, time.Since(start))
	}
	if got, _ := ReadGlobalManifest(ctx, store, prefix); got.Generation != 0 {
		t.Errorf("committed generation %d", got.Generation)
	}
}

// TestPodArchiveLimits: a Pod-made GLOBAL archive is checked within the limits its
// restores extract it within (the entries too), so a committed generation never makes
// the volume unrestorable.
func TestPodArchiveLimits(t *testing.T) {
	l := podArchiveLimits(1 << 30)
	if l.MaxFiles != maxRestoreFiles || l.MaxBytes != 1<<30 {
		t.Errorf("limits %+v, want MaxFiles %d (as restores), MaxBytes the volume's size", l, maxRestoreFiles)
	}
	if l := podArchiveLimits(-1); l.MaxBytes != 0 {
		t.Errorf("limits of a volume of no size %+v", l)
	}
}
