package runner

import "github.com/sandboxd/sandboxd/internal/runtime"

// assignID names a sandbox being created. A caller that takes the ID it is answered with
// (no ID named, or Meta[runtime.MetaAnyID] "true": the gateway) gets a reserved warm
// sandbox's ID when the backend keeps warm sandboxes under their own IDs
// (runtime.WarmReserver: the Kubernetes backend), so the Create claims it; otherwise the
// spec's ID, or a new one. A spec with a share-token hash keeps its ID: the hash was
// made for that ID. MetaAnyID is removed: it is a request, not a record.
func (r *Runner) assignID(spec *runtime.Spec) {
	anyID := spec.Meta[runtime.MetaAnyID] == "true"
	delete(spec.Meta, runtime.MetaAnyID)
	if spec.ID != "" && !anyID {
		return
	}
	if wr, ok := r.backend.(runtime.WarmReserver); ok && spec.ShareTokenHash == "" {
		if id, ok := wr.ReserveWarm(spec); ok {
			spec.ID = id
			return
		}
	}
	if spec.ID == "" {
		spec.ID = NewID()
	}
}
