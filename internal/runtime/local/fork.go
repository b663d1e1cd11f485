package local

import (
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Fork implements runtime.Forker.
func (b *Backend) Fork(ctx context.Context, src string, specs []*runtime.Spec) ([]runtime.Info, []error) {
	infos := make([]runtime.Info, len(specs))
	errs := make([]error, len(specs))
	for i := range specs {
		errs[i] = fmt.Errorf("fork %s: %w", src, errdefs.ErrNotImplemented)
	}
	return infos, errs
}
