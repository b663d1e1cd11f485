//go:build !linux

package sandbox

import (
	"context"
	"errors"
)

// packDir needs Linux (fsarchive reads the tree by descriptor with Linux system calls):
// elsewhere, make the archive on Linux and pass it to StartBuild.
func packDir(context.Context, string, *ignoreFilter, PackOptions) (*BuildContext, error) {
	return nil, errors.New("sandbox: packing a build context needs Linux; pass an archive made there to StartBuild")
}
