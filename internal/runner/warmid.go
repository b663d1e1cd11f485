package runner

import "github.com/sandboxd/sandboxd/internal/runtime"

// assignID names a sandbox being created. A caller that takes the ID it is answered with
// (no ID named, or Meta[runtime.MetaAnyID] "true": the gateway) gets a reserved warm
// sandbox's ID when the backend keeps warm sandboxes under their own IDs
// (runtime.WarmReserver: the Kubernetes backend), so the Create claims it; otherwise the
// spec's ID, or a new one. A spec with a share-token hash keeps its ID: the hash was
// made for that ID. MetaAnyID is removed: it is a request, not a record.
//
// creds are the main container's pull credentials, which the runner strips from spec
// before this (they are never kept) but the backend's Create gets back: the reservation
// is made for the spec the backend will see. reserved reports whether the ID is a warm
// reservation (to release when the Create does not reach the backend: releaseWarm).
func (r *Runner) assignID(spec *runtime.Spec, creds *runtime.Credentials) (reserved bool) {
	anyID := spec.Meta[runtime.MetaAnyID] == "true"
	delete(spec.Meta, runtime.MetaAnyID)
	if spec.ID != "" && !anyID {
		return false
	}
	if wr, ok := r.backend.(runtime.WarmReserver); ok && spec.ShareTokenHash == "" {
		rs := spec
		if creds != nil && spec.PullCredentials == nil {
			c := *spec // shallow: ReserveWarm only reads it
			c.PullCredentials = creds
			rs = &c
		}
		if id, ok := wr.ReserveWarm(rs); ok {
			spec.ID = id
			return true
		}
	}
	if spec.ID == "" {
		spec.ID = NewID()
	}
	return false
}

// releaseWarm gives back the warm reservation id when its Create returns before the
// backend's Create (it would hold the backend's refills back until it expires).
func (r *Runner) releaseWarm(id string) {
	if wr, ok := r.backend.(runtime.WarmReserver); ok {
		wr.ReleaseWarm(id)
	}
}
