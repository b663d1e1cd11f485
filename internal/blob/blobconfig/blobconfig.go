// Package blobconfig chooses and opens the blob store a process is configured with: the
// directory store (the embedded default) or an S3-compatible one. It is the one place
// that knows both implementations; everything else takes a blob.Store.
package blobconfig

import (
	"context"
	"errors"
	"fmt"
	"path"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
)

// Config selects a blob store: exactly one of Dir or S3.
type Config struct {
	// Dir is the root of a directory store (absolute).
	Dir string
	// S3 configures an S3-compatible store.
	S3 *s3.Config
}

// Validate reports the first thing wrong with c, naming the field (pure).
func (c Config) Validate() error {
	switch {
	case c.Dir != "" && c.S3 != nil:
		return errors.New("blob store: dir and s3 are exclusive")
	case c.Dir == "" && c.S3 == nil:
		return errors.New("blob store: one of dir or s3 is required")
	case c.Dir != "" && !path.IsAbs(c.Dir):
		return fmt.Errorf("blob store: dir %q: must be absolute", c.Dir)
	case c.S3 != nil:
		return c.S3.Validate()
	}
	return nil
}

// Bucket names where c's objects live, as a snapshot's object_bucket reports it: the S3
// bucket, or "local" for a directory store.
func (c Config) Bucket() string {
	if c.S3 != nil {
		return c.S3.Bucket
	}
	return "local"
}

// Open opens the store c selects.
func (c Config) Open(ctx context.Context) (blob.Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.S3 != nil {
		return s3.New(ctx, *c.S3)
	}
	return dir.Open(c.Dir)
}
