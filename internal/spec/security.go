package spec

import (
	"fmt"
	"slices"
	"strings"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// securityContext converts a container's wire security context (field f) into the
// runtime's, reporting malformed values as field violations. Whether privileged and
// capabilities_add are allowed is the policy's call (placement and the runner check it);
// here only their shape.
func securityContext(sc *sandboxv1.SecurityContext, f string) (*runtime.Security, []apierr.Violation) {
	if sc == nil {
		return nil, nil
	}
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	s := &runtime.Security{
		RunAsUser:                sc.RunAsUser,
		RunAsGroup:               sc.RunAsGroup,
		ReadOnlyRootFS:           sc.GetReadOnlyRootFilesystem(),
		AllowPrivilegeEscalation: sc.GetAllowPrivilegeEscalation(),
		Privileged:               sc.GetPrivileged(),
	}
	switch p := sc.GetSeccompProfile(); p {
	case "", runtime.SeccompRuntimeDefault:
		s.SeccompProfile = p
	default:
		add(f+".seccomp_profile", "%q is not offered: use %q (the runtime's default profile) or leave it empty", p, runtime.SeccompRuntimeDefault)
	}
	for i, c := range sc.GetCapabilitiesAdd() {
		canon, ok := runtime.CanonicalCapability(c)
		if !ok {
			add(fmt.Sprintf("%s.capabilities_add[%d]", f, i), "%q is not a Linux capability", c)
			continue
		}
		s.CapAdd = append(s.CapAdd, canon)
	}
	for i, c := range sc.GetCapabilitiesDrop() {
		if strings.EqualFold(strings.TrimSpace(c), "ALL") {
			s.CapDrop = append(s.CapDrop, "ALL")
			continue
		}
		canon, ok := runtime.CanonicalCapability(c)
		if !ok {
			add(fmt.Sprintf("%s.capabilities_drop[%d]", f, i), "%q is not a Linux capability (or ALL)", c)
			continue
		}
		s.CapDrop = append(s.CapDrop, canon)
	}
	if s.IsDefault() && s.SeccompProfile == "" && !s.Privileged {
		return nil, vs
	}
	return s, vs
}

// securityForPolicy is the wire form of a runtime security context, for the policy
// check (which constrains privileged and capabilities_add).
func securityForPolicy(s *runtime.Security) *sandboxv1.SecurityContext {
	if s == nil {
		return nil
	}
	sc := &sandboxv1.SecurityContext{
		RunAsUser: s.RunAsUser, RunAsGroup: s.RunAsGroup,
		CapabilitiesAdd: slices.Clone(s.CapAdd), CapabilitiesDrop: slices.Clone(s.CapDrop),
		SeccompProfile: s.SeccompProfile,
	}
	if s.Privileged {
		sc.Privileged = &s.Privileged
	}
	if s.ReadOnlyRootFS {
		sc.ReadOnlyRootFilesystem = &s.ReadOnlyRootFS
	}
	if s.AllowPrivilegeEscalation {
		sc.AllowPrivilegeEscalation = &s.AllowPrivilegeEscalation
	}
	return sc
}
