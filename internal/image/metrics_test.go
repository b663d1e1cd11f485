package image_test

import (
	"context"
	"testing"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestPullMetrics: a first pull is a miss and counts the layers' compressed bytes, the
// same image again a hit with no bytes, a pull that fails an error (a miss); one
// duration observation each.
func TestPullMetrics(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	host := startRegistry(t, testimage.RegistryOptions{})
	img := smallImage(t, "m")
	if _, err := testimage.Push(host, "x/metrics:a", img); err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var size int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			t.Fatal(err)
		}
		size += n
	}
	s := openStore(t, image.Options{})

	const (
		okMiss  = `cwsandbox_image_pulls_total{cache="miss",result="ok"}`
		okHit   = `cwsandbox_image_pulls_total{cache="hit",result="ok"}`
		errMiss = `cwsandbox_image_pulls_total{cache="miss",result="error"}`
		bytes   = `cwsandbox_image_pull_bytes_total`
		durMiss = `cwsandbox_image_pull_duration_seconds_count{cache="miss",result="ok"}`
		durHit  = `cwsandbox_image_pull_duration_seconds_count{cache="hit",result="ok"}`
		durErr  = `cwsandbox_image_pull_duration_seconds_count{cache="miss",result="error"}`
	)
	step := func(name string, want map[string]float64, pull func() error) {
		t.Helper()
		before := counters.Values()
		if err := pull(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		after := counters.Values()
		for _, k := range []string{okMiss, okHit, errMiss, bytes, durMiss, durHit, durErr} {
			if got := after[k] - before[k]; got != want[k] {
				t.Errorf("%s: %s grew by %v, want %v", name, k, got, want[k])
			}
		}
	}
	step("first pull", map[string]float64{okMiss: 1, bytes: float64(size), durMiss: 1}, func() error {
		_, err := s.Pull(ctx, host+"/x/metrics:a", nil)
		return err
	})
	step("cached pull", map[string]float64{okHit: 1, durHit: 1}, func() error {
		_, err := s.Pull(ctx, host+"/x/metrics:a", nil)
		return err
	})
	step("missing image", map[string]float64{errMiss: 1, durErr: 1}, func() error {
		if _, err := s.Pull(ctx, host+"/x/absent:a", nil); err == nil {
			t.Error("pulling an absent image succeeded")
		}
		return nil
	})
}
