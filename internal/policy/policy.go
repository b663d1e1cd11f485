// Package policy is the runner policy: a versioned document of defaults ("base") and
// typed limits ("constraints"), and the resolution of a sandbox spec against it.
//
// Resolution merges platform defaults, then the policy's base, then the spec (the spec
// wins for each scalar; base attachments such as env, annotations and tags always
// apply), and then checks every constraint on the fully resolved spec. A request outside
// a limit is rejected with a violation naming the field, the constraint and the limit;
// nothing is ever narrowed silently.
//
// The package is pure: no I/O, no clocks, no mutable globals.
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Version is the only policy document version this package understands. A document
// without "version" is version 1.
const Version = 1

// Policy is one runner's policy document. The zero value (JSON {}) is valid and permissive:
// only the platform's own limits apply.
type Policy struct {
	// Version of the document format; 0 (absent) means 1.
	Version int `json:"version,omitempty"`
	// Base holds defaults and attachments applied before constraints are checked.
	Base Base `json:"base,omitzero"`
	// Constraints are the limits checked on the resolved spec.
	Constraints Constraints `json:"constraints,omitzero"`
	// ControlPlaneAccess limits who may call the Sandbox API for the runner's sandboxes
	// (by source address); it is independent of base and constraints, which shape what a
	// sandbox may be. See sourceip.go.
	ControlPlaneAccess ControlPlaneAccess `json:"control_plane_access,omitzero"`
}

// Base holds the defaults and attachments of a policy.
type Base struct {
	// MaxLifetimeSeconds is the lifetime of a sandbox that asks for none (or for 0).
	MaxLifetimeSeconds int32 `json:"max_lifetime_seconds,omitempty"`
	// Resources fills each container's unset requests and limits, per quantity.
	Resources *ResourceDefaults `json:"resources,omitempty"`
	// Env is added to every container; a container's own value for a key wins.
	Env map[string]string `json:"env,omitempty"`
	// Annotations are added to every sandbox; the spec's own value for a key wins.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Tags are added to every sandbox (deduplicated).
	Tags []string `json:"tags,omitempty"`
	// DefaultCPURuntimeClass and DefaultGPURuntimeClass are used when the spec pins no
	// runtime class; a sandbox with any GPU takes the GPU one.
	DefaultCPURuntimeClass string `json:"default_cpu_runtime_class,omitempty"`
	DefaultGPURuntimeClass string `json:"default_gpu_runtime_class,omitempty"`
	// DefaultEgress and DefaultIngress are used when the spec declares no rules of that
	// direction (and does not deny that direction).
	DefaultEgress  []Rule `json:"default_egress,omitempty"`
	DefaultIngress []Rule `json:"default_ingress,omitempty"`
	// Pod holds Kubernetes Pod settings (node selector, tolerations, priority class,
	// service account, image pull secrets, Pod annotations) for runners on the
	// Kubernetes backend; other backends ignore them.
	Pod *runtime.PodSettings `json:"pod,omitempty"`
	// Pause holds the settings of pausing sandboxes (PauseSettings): whether the
	// lifetime counts while paused, auto-resume, idle pause.
	Pause *PauseSettings `json:"pause,omitempty"`
	// VolumeStorageClass is the storage class of the claims a Kubernetes runner makes for
	// registered volumes (docs/volumes.md); absent: the cluster's default class. Must be in
	// constraints.volumes.allowed_storage_classes when that is set.
	VolumeStorageClass string `json:"volume_storage_class,omitempty"`
}

// ResourceDefaults are per-container default requests and limits.
type ResourceDefaults struct {
	Requests ResourceValues `json:"requests,omitzero"`
	Limits   ResourceValues `json:"limits,omitzero"`
}

// ResourceValues are quantities as the API writes them ("500m", "2", "512Mi").
type ResourceValues struct {
	CPU    Quantity `json:"cpu,omitempty"`
	Memory Quantity `json:"memory,omitempty"`
}

// Quantity is a resource quantity. In JSON it is a string ("500m", "4Gi") or, for
// convenience, a number (2 is "2").
type Quantity string

// UnmarshalJSON accepts a string or a number.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*q = Quantity(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return errors.New("a quantity must be a string such as \"500m\" or \"4Gi\", or a number")
	}
	*q = Quantity(n.String())
	return nil
}

// Rule is a network rule in a policy: a default rule (base) or an envelope entry
// (constraints.network). Exactly one of CIDR, HTTPSHostname, Tenant or Any is set.
type Rule struct {
	// CIDR is an IPv4 or IPv6 prefix; Except carves prefixes out of it.
	CIDR   string   `json:"cidr,omitempty"`
	Except []string `json:"except,omitempty"`
	// HTTPSHostname (egress only) is an exact host name or "*.example.com" (one label);
	// in an envelope, "*" allows every host name.
	HTTPSHostname string `json:"https_hostname,omitempty"`
	// Tenant is SAME_USER, SAME_ORG or SANDBOX_NETWORK.
	Tenant string `json:"tenant,omitempty"`
	// Any is every destination (egress) or source (ingress) the platform routes.
	Any bool `json:"any,omitempty"`
	// Ports limits the rule; empty means all ports.
	Ports []PortRange `json:"ports,omitempty"`
}

// PortRange is a protocol and a port or inclusive range of ports.
type PortRange struct {
	// Protocol is TCP, UDP or SCTP; empty means TCP.
	Protocol string `json:"protocol,omitempty"`
	// Port is the first port; 0 means all ports of the protocol.
	Port int32 `json:"port,omitempty"`
	// EndPort is the last port of a range; 0 means just Port.
	EndPort int32 `json:"end_port,omitempty"`
}

// Constraints are the policy's limits. Every group is optional; an absent group
// constrains nothing beyond the platform's limits. In the allow-lists below, an absent
// list constrains nothing and an empty list ([]) allows nothing.
type Constraints struct {
	Lifetime      *LifetimeConstraints     `json:"lifetime,omitempty"`
	Resources     *ResourceConstraints     `json:"resources,omitempty"`
	Images        *ImageConstraints        `json:"images,omitempty"`
	Services      *ServiceConstraints      `json:"services,omitempty"`
	Network       *NetworkConstraints      `json:"network,omitempty"`
	Security      *SecurityConstraints     `json:"security,omitempty"`
	Annotations   *AnnotationConstraints   `json:"annotations,omitempty"`
	InstanceTypes *InstanceTypeConstraints `json:"instance_types,omitempty"`
	Volumes       *VolumeConstraints       `json:"volumes,omitempty"`
}

// LifetimeConstraints bound max_lifetime_seconds.
type LifetimeConstraints struct {
	// MaxSeconds is the longest lifetime a sandbox may have (at most 30 days).
	MaxSeconds int32 `json:"max_seconds,omitempty"`
}

// ResourceConstraints are per-container maxima and sandbox-wide ceilings.
type ResourceConstraints struct {
	// MaxCPU, MaxMemory and MaxGPU bound each container's requests and limits.
	MaxCPU    Quantity `json:"max_cpu,omitempty"`
	MaxMemory Quantity `json:"max_memory,omitempty"`
	MaxGPU    *int64   `json:"max_gpu,omitempty"`
	// TotalCPU, TotalMemory and TotalGPU are ceilings on the sum over all containers of
	// each container's enforced limit.
	TotalCPU    Quantity `json:"total_cpu,omitempty"`
	TotalMemory Quantity `json:"total_memory,omitempty"`
	TotalGPU    *int64   `json:"total_gpu,omitempty"`
}

// ImageConstraints allow-list container images.
type ImageConstraints struct {
	// AllowedRegistries are registry hosts ("ghcr.io", "localhost:5000", "*.example.com").
	// "docker.io" also matches unqualified names such as "python:3.11".
	AllowedRegistries []string `json:"allowed_registries,omitzero"`
	// AllowedRepositories are glob patterns over the repository path ("library/*",
	// "myorg/**"), or over host/path when the first segment is a host
	// ("ghcr.io/myorg/**"). "*" and "?" stay within a segment; "**" spans segments.
	AllowedRepositories []string `json:"allowed_repositories,omitzero"`
	// RequireDigest demands images pinned by digest ("repo@sha256:…").
	RequireDigest bool `json:"require_digest,omitempty"`
}

// ServiceConstraints limit exposed ports.
type ServiceConstraints struct {
	// MaxServices replaces the platform default of 5 services per sandbox (higher or
	// lower; 0 forbids services).
	MaxServices *int `json:"max_services,omitempty"`
	// AllowedVisibilities lists PUBLIC, PRIVATE and/or CUSTOM. A service without a
	// visibility is not reachable from outside and is always allowed.
	AllowedVisibilities []string `json:"allowed_visibilities,omitzero"`
	// AllowedEndpointKinds lists HTTPS and/or TLS_PASSTHROUGH.
	AllowedEndpointKinds []string `json:"allowed_endpoint_kinds,omitzero"`
}

// NetworkConstraints are envelopes: the rules a sandbox may request (or receive from
// base). An absent or empty envelope constrains nothing.
type NetworkConstraints struct {
	AllowedEgress  []Rule `json:"allowed_egress,omitempty"`
	AllowedIngress []Rule `json:"allowed_ingress,omitempty"`
	// AllowSelectors entitles egress rules with pod/namespace selectors when
	// AllowedEgress is set (an "any" entry never covers selectors).
	AllowSelectors bool `json:"allow_selectors,omitempty"`
}

// SecurityConstraints limit runtime classes and container privileges.
type SecurityConstraints struct {
	// AllowedRuntimeClasses lists the runtime classes a sandbox may run with, pinned or
	// by default.
	AllowedRuntimeClasses []string `json:"allowed_runtime_classes,omitzero"`
	// PrivilegedAllowed false forbids privileged containers; absent leaves it to the
	// platform.
	PrivilegedAllowed *bool `json:"privileged_allowed,omitempty"`
	// AllowedCapabilities lists the Linux capabilities containers may add ("NET_ADMIN"
	// or "CAP_NET_ADMIN").
	AllowedCapabilities []string `json:"allowed_capabilities,omitzero"`
	// ContainerEngineAllowed false forbids container-engine sandboxes (control
	// CONTROL_CONTAINER_ENGINE: a Compose file run by Docker Engine inside the sandbox);
	// absent leaves it to the runner (whether it has an engine).
	ContainerEngineAllowed *bool `json:"container_engine_allowed,omitempty"`
}

// AnnotationConstraints limit sandbox annotations (base ones included).
type AnnotationConstraints struct {
	MaxCount       *int     `json:"max_count,omitempty"`
	DeniedPrefixes []string `json:"denied_prefixes,omitempty"`
}

// InstanceTypeConstraints allow-list instance_type pins.
type InstanceTypeConstraints struct {
	Allowed []string `json:"allowed,omitzero"`
}

// Parse decodes a JSON policy document strictly: unknown fields, trailing data and a
// non-object document are errors. It does not Validate.
func Parse(data []byte) (*Policy, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return nil, errors.New("policy: the document must be a JSON object ({} is the permissive policy)")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Policy
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("policy: unexpected data after the document")
	}
	return &p, nil
}

// Marshal encodes p as indented JSON.
func Marshal(p *Policy) ([]byte, error) {
	return json.MarshalIndent(p, "", "  ")
}

// normalizeCapability turns "cap_net_admin" into "NET_ADMIN".
func normalizeCapability(c string) string {
	c = strings.ToUpper(strings.TrimSpace(c))
	return strings.TrimPrefix(c, "CAP_")
}
