// Package s3test runs a real S3-compatible server for tests: SeaweedFS (`weed server -s3`,
// Apache-2.0), built from the Go module proxy by scripts/build-seaweedfs.sh (`make
// seaweedfs`) into $SANDBOXD_CACHE/seaweedfs/<Version>/weed. Start runs one on loopback
// ports with its data in a temp dir and stops it by PID when the test ends.
//
// Without the binary (or in -short, the unit tier) tests skip, unless RequireEnv=1 (CI
// sets it), where they fail.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sandboxd/sandboxd/internal/blob/s3"
)

// Version is the SeaweedFS module version; scripts/build-seaweedfs.sh builds the same.
const Version = "v0.0.0-20261109003541-7506e5f91cd6"

// RequireEnv set to 1 turns a skip for want of the server into a failure.
const RequireEnv = "SANDBOXD_REQUIRE_S3"

// BinEnv overrides the weed binary's path.
const BinEnv = "SANDBOXD_SEAWEEDFS"

// Server is a running SeaweedFS S3 gateway.
type Server struct {
	Endpoint             string // 127.0.0.1:port
	AccessKey, SecretKey string
	// Client is an admin client of the server (for making buckets, tampering).
	Client *minio.Client
}

// Bin returns the weed binary's path, or why there is none.
func Bin() (string, error) {
	if b := os.Getenv(BinEnv); b != "" {
		return b, nil
	}
	cache := os.Getenv("SANDBOXD_CACHE")
	if cache == "" {
		cache = "/var/cache/sandboxd"
	}
	b := filepath.Join(cache, "seaweedfs", Version, "weed")
	if _, err := os.Stat(b); err != nil {
		return "", fmt.Errorf("seaweedfs is not built (make seaweedfs): %w", err)
	}
	return b, nil
}

func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s (%s=1 requires the S3 server)", why, RequireEnv)
	}
	t.Skip(why)
}

// freePorts returns n distinct free loopback ports (free when asked; the server binds
// them a moment later).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// Start runs a SeaweedFS server (master, volume, filer, S3 gateway in one process) for
// the test and waits until its S3 API answers.
func Start(t testing.TB) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("-short runs the unit tier: no S3 server")
	}
	bin, err := Bin()
	if err != nil {
		skipOrFail(t, err.Error())
	}
	dir := t.TempDir()
	var rnd [16]byte
	_, _ = rand.Read(rnd[:])
	s := &Server{AccessKey: "sandboxd-test", SecretKey: hex.EncodeToString(rnd[:])}
	cfg := fmt.Sprintf(`{"identities":[{"name":"sandboxd","credentials":[{"accessKey":%q,"secretKey":%q}],"actions":["Admin","Read","Write","List","Tagging"]}]}`, s.AccessKey, s.SecretKey)
	if err := os.WriteFile(filepath.Join(dir, "s3.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	p := freePorts(t, 9)
	s.Endpoint = "127.0.0.1:" + strconv.Itoa(p[6])
	cmd := exec.Command(bin, "server",
		"-dir="+data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port="+strconv.Itoa(p[0]), "-master.port.grpc="+strconv.Itoa(p[1]),
		"-volume.port="+strconv.Itoa(p[2]), "-volume.port.grpc="+strconv.Itoa(p[3]),
		"-filer", "-filer.port="+strconv.Itoa(p[4]), "-filer.port.grpc="+strconv.Itoa(p[5]),
		"-filer.localSocket="+filepath.Join(dir, "filer.sock"),
		"-s3", "-s3.port="+strconv.Itoa(p[6]), "-s3.port.grpc="+strconv.Itoa(p[7]),
		"-s3.port.iceberg=0", "-s3.port.lance=0", "-iam.port="+strconv.Itoa(p[8]),
		"-s3.localSocket="+filepath.Join(dir, "s3.sock"),
		"-s3.config="+filepath.Join(dir, "s3.json"),
		// A fixed volume count: "-volume.max=0" sizes it by the disk's free space
		// (free / volumeSizeLimit), and every bucket grows 7 volumes, so on a machine
		// with a few GB free the third bucket found no writable volume (CI, stop 34).
		// Volumes are sparse (no preallocation), so a large count costs nothing.
		"-master.volumeSizeLimitMB=64", "-volume.max=400",
	)
	cmd.Dir = dir
	logf, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // by PID: the one process it started
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("seaweedfs log (tail):\n%s", b)
		}
		logf.Close()
	})
	s.Client, err = minio.New(s.Endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Ready when a bucket can be made and an object written (the volume server may join
	// the master after the S3 API answers).
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = s.probe(ctx)
		cancel()
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("seaweedfs at %s not ready: %v", s.Endpoint, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (s *Server) probe(ctx context.Context) error {
	const b = "sandboxd-probe"
	if ok, err := s.Client.BucketExists(ctx, b); err != nil {
		return err
	} else if !ok {
		if err := s.Client.MakeBucket(ctx, b, minio.MakeBucketOptions{}); err != nil {
			return err
		}
	}
	_, err := s.Client.PutObject(ctx, b, "probe", bytesReader("ok"), 2, minio.PutObjectOptions{})
	return err
}

// Bucket makes a fresh bucket and returns a Config for it.
func (s *Server) Bucket(t testing.TB) s3.Config {
	t.Helper()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "t-" + hex.EncodeToString(rnd[:])
	if err := s.Client.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket %s: %v", name, err)
	}
	return s3.Config{Endpoint: s.Endpoint, Bucket: name, AccessKey: s.AccessKey, SecretKey: s.SecretKey, PathStyle: true, Insecure: true}
}
