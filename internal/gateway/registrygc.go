package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The registry garbage collector (issue 22) deletes the platform registry's images that
// nothing needs any more. Needed are the images named by any template that is not
// deleted (its spec or its attachments, e.g. a Compose file) and by any sandbox that has
// not ended: a paused sandbox may resume on another runner, which pulls its image again.
// Every string of those records is scanned for image references (registry.References:
// by digest or tag, whatever the host), so a new spec field naming an image is covered
// without this file knowing it; scanning can only keep too much. What was pushed within
// the grace stays too (registry.GCOptions.Grace): a build pushes, then points its
// template at the digest. Any error reading the store fails the pass and deletes
// nothing.

// DefaultRegistryGCInterval is RegistryGCConfig.Interval's default.
const DefaultRegistryGCInterval = time.Hour

// RegistryGCConfig configures the registry garbage collector.
type RegistryGCConfig struct {
	// Interval between passes (0: DefaultRegistryGCInterval; negative: no passes).
	Interval time.Duration
	// Grace: see registry.GCOptions.Grace (0: registry.DefaultGCGrace).
	Grace time.Duration
}

// RegistryCollector is the registry (registry.Registry is one).
type RegistryCollector interface {
	GC(ctx context.Context, opts registry.GCOptions) (registry.GCResult, error)
}

// RegistryGCStore is where the references are read (store.Store is one).
type RegistryGCStore interface {
	Orgs() store.Orgs
	Templates() store.Templates
	Sandboxes() store.Sandboxes
	BuildStorageConfigs() store.BuildStorageConfigs
}

// RegistryGC runs the passes.
type RegistryGC struct {
	reg RegistryCollector
	st  RegistryGCStore
	cfg RegistryGCConfig
	log *slog.Logger
}

// NewRegistryGC returns the collector of reg, with the references of st.
func NewRegistryGC(reg RegistryCollector, st RegistryGCStore, cfg RegistryGCConfig, log *slog.Logger) *RegistryGC {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultRegistryGCInterval
	}
	if log == nil {
		log = slog.Default()
	}
	return &RegistryGC{reg: reg, st: st, cfg: cfg, log: log}
}

// Run runs a pass every Interval (the first one Interval after the start) until ctx is
// done; a negative Interval returns at once.
func (g *RegistryGC) Run(ctx context.Context) {
	if g.cfg.Interval < 0 {
		return
	}
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := g.Pass(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			g.log.Warn("registry gc: pass failed", "err", err, "manifests", res.Manifests, "blobs", res.Blobs)
		case err == nil && res != (registry.GCResult{}):
			g.log.Info("registry gc", "manifests", res.Manifests, "blobs", res.Blobs, "links", res.Links)
		}
	}
}

// Pass reads the references and collects once.
func (g *RegistryGC) Pass(ctx context.Context) (registry.GCResult, error) {
	refs, own, err := g.references(ctx)
	if err != nil {
		return registry.GCResult{}, fmt.Errorf("registry gc: references: %w", err)
	}
	return g.reg.GC(ctx, registry.GCOptions{Keep: refs.Keep, Grace: g.cfg.Grace, OrgStorages: own})
}

// references are the image references of every organization's templates that are not
// deleted and sandboxes that have not ended, and the organizations whose build storage
// is their own bucket (CUSTOMER_OWNED: collected there too, by the same references).
func (g *RegistryGC) references(ctx context.Context) (*registry.References, []string, error) {
	refs := &registry.References{}
	orgs, err := g.st.Orgs().List(ctx)
	if err != nil {
		return nil, nil, err
	}
	var own []string
	for _, o := range orgs {
		switch c, err := g.st.BuildStorageConfigs().Get(ctx, o.ID); {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return nil, nil, fmt.Errorf("build storage config of %s: %w", o.ID, err)
		case customerOwned(c.Mode):
			own = append(own, o.ID)
		}
		for page := (store.Page{Size: store.MaxPageSize}); ; {
			ts, next, err := g.st.Templates().List(ctx, o.ID, false, page)
			if err != nil {
				return nil, nil, fmt.Errorf("templates of %s: %w", o.ID, err)
			}
			for _, t := range ts {
				if err := scanTemplate(refs, t); err != nil {
					return nil, nil, fmt.Errorf("template %s of %s: %w", t.ID, o.ID, err)
				}
			}
			if next == "" {
				break
			}
			page.Token = next
		}
		for page := (store.Page{Size: store.MaxPageSize}); ; {
			sbs, next, err := g.st.Sandboxes().List(ctx, o.ID, store.SandboxFilter{}, page)
			if err != nil {
				return nil, nil, fmt.Errorf("sandboxes of %s: %w", o.ID, err)
			}
			for _, sb := range sbs {
				if err := scanJSON(refs, sb.Spec); err != nil {
					return nil, nil, fmt.Errorf("sandbox %s of %s: %w", sb.ID, o.ID, err)
				}
			}
			if next == "" {
				break
			}
			page.Token = next
		}
	}
	return refs, own, nil
}

func scanTemplate(refs *registry.References, t store.Template) error {
	p := &sandboxv1.PartialSandboxSpec{}
	if err := proto.Unmarshal(t.Spec, p); err != nil {
		return err
	}
	scanProto(refs, p.ProtoReflect())
	return scanJSON(refs, t.Attachments)
}

// scanProto scans every string of m, however deep.
func scanProto(refs *registry.References, m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		scanValue := func(fd protoreflect.FieldDescriptor, v protoreflect.Value) {
			switch fd.Kind() {
			case protoreflect.StringKind:
				refs.Scan(v.String())
			case protoreflect.MessageKind, protoreflect.GroupKind:
				scanProto(refs, v.Message())
			}
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				scanValue(fd, l.Get(i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				refs.Scan(k.String())
				scanValue(fd.MapValue(), mv)
				return true
			})
		default:
			scanValue(fd, v)
		}
		return true
	})
}

// scanJSON scans every string (keys too) of the JSON document b (nil: none).
func scanJSON(refs *registry.References, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			refs.Scan(x)
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for k, e := range x {
				refs.Scan(k)
				walk(e)
			}
		}
	}
	walk(v)
	return nil
}
