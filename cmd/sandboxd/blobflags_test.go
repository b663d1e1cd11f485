package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// blobCases are the --blob-* command lines every command that has them checks alike.
var blobCases = []validateCase{
	{args: []string{"--blob-dir", "/var/lib/sandboxd/blobs"}},
	{args: []string{"--blob-dir", "relative/blobs"}, err: "absolute"},
	{args: []string{"--blob-s3-endpoint", "127.0.0.1:8333", "--blob-s3-bucket", "snaps", "--blob-s3-path-style", "--blob-s3-insecure",
		"--blob-s3-access-key-file", "/run/secrets/ak", "--blob-s3-secret-key-file", "/run/secrets/sk"}},
	{args: []string{"--blob-s3-endpoint", "127.0.0.1:8333", "--blob-s3-bucket", "snaps"}, err: "--blob-s3-access-key-file"},
	{args: []string{"--blob-s3-bucket", "snaps"}, err: "--blob-s3-endpoint"},
	{args: []string{"--blob-s3-endpoint", "http://s3.example.com", "--blob-s3-bucket", "snaps",
		"--blob-s3-access-key-file", "/ak", "--blob-s3-secret-key-file", "/sk"}, err: "endpoint"},
	{args: []string{"--blob-s3-endpoint", "s3.example.com", "--blob-s3-bucket", "Bad_Bucket",
		"--blob-s3-access-key-file", "/ak", "--blob-s3-secret-key-file", "/sk"}, err: "bucket"},
	{args: []string{"--blob-dir", "/b", "--blob-s3-endpoint", "s3.example.com", "--blob-s3-bucket", "snaps",
		"--blob-s3-access-key-file", "/ak", "--blob-s3-secret-key-file", "/sk"}, err: "exclusive"},
	{args: []string{"--blob-s3-endpoint", "s3.example.com", "--blob-s3-bucket", "snaps", "--blob-s3-insecure", "--blob-s3-ca-file", "/ca.pem",
		"--blob-s3-access-key-file", "/ak", "--blob-s3-secret-key-file", "/sk"}, err: "insecure"},
}

func TestBlobFlagsValidate(t *testing.T) {
	testValidate(t, func() validator { return new(runnerConfig) }, append(blobCases,
		validateCase{args: []string{"--snapshots-per-sandbox", "-1"}, err: "--snapshots-per-sandbox"}))
	testValidate(t, func() validator { return new(devConfig) }, blobCases)
	gw := func(args ...string) []string { return append([]string{"--runner", "r1=127.0.0.1:7443"}, args...) }
	var gwCases []validateCase
	for _, c := range blobCases {
		gwCases = append(gwCases, validateCase{args: gw(c.args...), err: c.err})
	}
	testValidate(t, func() validator { return new(gatewayConfig) }, gwCases)
}

// TestBlobFlagsConfig: the S3 keys come from their files (trimmed), never the command
// line; a missing or empty key file is an error naming its flag; dev's default is a dir
// store, the runner's none.
func TestBlobFlagsConfig(t *testing.T) {
	dir := t.TempDir()
	ak, sk, empty := filepath.Join(dir, "ak"), filepath.Join(dir, "sk"), filepath.Join(dir, "empty")
	for p, v := range map[string]string{ak: "AKID\n", sk: "  s3cr3t\n", empty: "\n"} {
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b := blobFlags{endpoint: "127.0.0.1:8333", bucket: "snaps", accessKeyFile: ak, secretKeyFile: sk, pathStyle: true, insecure: true}
	cfg, ok, err := b.config("")
	if err != nil || !ok || cfg.S3 == nil || cfg.S3.AccessKey != "AKID" || cfg.S3.SecretKey != "s3cr3t" || !cfg.S3.PathStyle || cfg.Bucket() != "snaps" {
		t.Fatalf("config = %+v, %v, %v", cfg.S3, ok, err)
	}
	b.secretKeyFile = empty
	if _, _, err := b.config(""); err == nil || !strings.Contains(err.Error(), "--blob-s3-secret-key-file") {
		t.Fatalf("empty secret key file: %v", err)
	}
	b.secretKeyFile = filepath.Join(dir, "missing")
	if _, _, err := b.config(""); err == nil || !strings.Contains(err.Error(), "--blob-s3-secret-key-file") {
		t.Fatalf("missing secret key file: %v", err)
	}
	if _, ok, err := (blobFlags{}).config(""); ok || err != nil {
		t.Fatalf("no flags, no default: ok %v, err %v", ok, err)
	}
	st, cfg, closeStore, err := (blobFlags{}).open(context.Background(), filepath.Join(dir, "blobs"))
	if err != nil || st == nil || cfg.Bucket() != "local" || cfg.Dir != filepath.Join(dir, "blobs") {
		t.Fatalf("dev's default: %v, %+v, %v", st, cfg, err)
	}
	closeStore()
	if fi, err := os.Stat(filepath.Join(dir, "blobs")); err != nil || !fi.IsDir() {
		t.Fatalf("the default dir store was not made: %v", err)
	}
}
