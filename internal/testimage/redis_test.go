package testimage

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestServeDockerHubServesRedis: with redis.tar built, the docker.io mirror serves it as
// redis:7 (the Compose conformance test's image): redis-server its command, redis-cli in it.
func TestServeDockerHubServesRedis(t *testing.T) {
	if _, err := RedisImage(); errors.Is(err, ErrNoTestImages) {
		t.Skipf("%v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	if _, err := StandardImages(); errors.Is(err, ErrNoTestImages) {
		t.Skipf("%v", err)
	}
	host, stop, err := ServeDockerHub(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ref, err := name.ParseReference(host+"/"+DockerHubRedis, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Config.Cmd, []string{"redis-server"}) {
		t.Errorf("cmd %v, want redis-server", cfg.Config.Cmd)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want := map[string]bool{"usr/bin/redis-server": false, "usr/bin/redis-cli": false}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n := strings.TrimPrefix(h.Name, "./")
		if _, ok := want[n]; ok {
			want[n] = true
		}
	}
	for f, ok := range want {
		if !ok {
			t.Errorf("%s missing from the redis image", f)
		}
	}
}
