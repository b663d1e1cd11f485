package registry

import (
	"context"
	"fmt"
	"io"

	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/distribution/distribution/v3/registry/storage/driver/factory"
)

// An S3 bucket may be an organization's own (CUSTOMER_OWNED), written by whoever holds
// its credentials, not only by Distribution. Distribution reads small objects (layer and
// tag links, upload start times, hash states) with the driver's GetContent, which the
// s3-aws driver reads whole (io.ReadAll): one multi-GB link object would have the
// registry, every organization's, run out of memory on a manifest GET, a blob HEAD or a
// GC pass. The registry's S3 storages (the platform's too) are therefore opened as
// limitedS3Driver: the s3-aws driver with GetContent refusing an object over
// maxGetContent (what Distribution writes so is tens of bytes; manifests, bounded to
// 4 MiB on PUT, are read with their own bound).
const (
	limitedS3Driver = "sandboxd-s3"
	maxGetContent   = 4 << 20
)

func init() { factory.Register(limitedS3Driver, limitedS3Factory{}) }

type limitedS3Factory struct{}

func (limitedS3Factory) Create(ctx context.Context, params map[string]any) (storagedriver.StorageDriver, error) {
	d, err := factory.Create(ctx, "s3", params)
	if err != nil {
		return nil, err
	}
	return limitedDriver{d}, nil
}

// limitedDriver is a driver whose GetContent reads at most maxGetContent bytes.
type limitedDriver struct {
	storagedriver.StorageDriver
}

// GetContent reads the object at path, refusing (without reading it all) one over
// maxGetContent.
func (d limitedDriver) GetContent(ctx context.Context, path string) ([]byte, error) {
	r, err := d.Reader(ctx, path, 0)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, maxGetContent+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxGetContent {
		return nil, storagedriver.Error{DriverName: limitedS3Driver, Detail: fmt.Errorf("%s: object over %d bytes: refused", path, maxGetContent)}
	}
	return b, nil
}
