package spec

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// notConverted are the fields of the public SandboxSpec (by path of proto field names,
// and everything under it) that ToCreateRequest reads, if at all, without putting them
// into the runner request, and why.
var notConverted = map[string]string{
	"services.protocol":       "validated here (endpoints carry TCP only); the runtime's services need no protocol",
	"tags":                    "validated here; the gateway's index keeps them (list and delete filters), not the runner",
	"annotations":             "validated here; placement's policy check reads them; no runner needs them",
	"runner_ids":              "placement's: the gateway checks them with the spec's problems (toCreateRequest) and places by them",
	"mode":                    "SERVERLESS or CKS: sandboxd places on the runners it has either way",
	"runtime_class_selection": "the target system's class enum, read nowhere in sandboxd: runtime_class names the class",
	"network.dns_egress":      "ALLOW is what the platform resolver does anyway; DENY is refused (TestNetworkUnimplemented)",
}

// refused are the fields that ToCreateRequest refuses whenever they are set (with every
// field under them set, on an otherwise valid spec), with the code: what this sandboxd
// cannot do yet is NOT_IMPLEMENTED rather than silently ignored.
var refused = map[string]connect.Code{
	"containers.resources.gpu":                      connect.CodeUnimplemented,
	"containers.resource_requirements.limits.gpu":   connect.CodeUnimplemented,
	"containers.resource_requirements.requests.gpu": connect.CodeUnimplemented,
	"containers.secret_stores":                      connect.CodeUnimplemented,
	"containers.image_pull_credentials":             connect.CodeUnimplemented,
	"volumes.volume_id":                             connect.CodeUnimplemented,
	"volumes.scratch.restore_from_snapshot_id":      connect.CodeUnimplemented,
	"network_ids":                          connect.CodeUnimplemented,
	"network_config_id":                    connect.CodeUnimplemented,
	"object_storage_access":                connect.CodeUnimplemented,
	"instance_type":                        connect.CodeUnimplemented,
	"network.egress.selector":              connect.CodeUnimplemented,
	"network.egress.sandboxd_secret":       connect.CodeUnimplemented,   // without a secret resolver
	"network.egress.https_hostname_except": connect.CodeInvalidArgument, // policy-only
}

// wireFixtures are valid specs that, between them, set every field ToCreateRequest
// converts.
func wireFixtures() []*sandboxv1.SandboxSpec {
	udp := func(p, end int32) []*sandboxv1.PortRange {
		return []*sandboxv1.PortRange{{Protocol: "UDP", Port: p, EndPort: end}}
	}
	return []*sandboxv1.SandboxSpec{{
		Containers: []*sandboxv1.Container{{
			Name: "main", Primary: proto.Bool(true), Image: "busybox", Command: "sh", Args: []string{"-c", "true"},
			EnvironmentVariables: map[string]string{"A": "b"}, WorkingDir: "/w",
			Files: []*sandboxv1.FileMount{{Path: "/f", Content: []byte("x")}},
			ResourceRequirements: &sandboxv1.ResourceRequirements{
				Limits:   &sandboxv1.Resources{Cpu: "2", Memory: "2Gi"},
				Requests: &sandboxv1.Resources{Cpu: "500m", Memory: "1Gi"},
			},
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "data", MountPath: "/data", ReadOnly: true, SubPath: "x"}},
			SecurityContext: &sandboxv1.SecurityContext{
				RunAsUser: proto.Uint32(1000), RunAsGroup: proto.Uint32(1000), Privileged: proto.Bool(true),
				AllowPrivilegeEscalation: proto.Bool(true), ReadOnlyRootFilesystem: proto.Bool(true),
				CapabilitiesAdd: []string{"NET_ADMIN"}, CapabilitiesDrop: []string{"ALL"}, SeccompProfile: "RuntimeDefault",
			},
		}},
		Volumes: []*sandboxv1.SandboxVolume{{Name: "data", Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{
			Size: "1Gi", Medium: sandboxv1.StorageMedium_STORAGE_MEDIUM_MEMORY}}}},
		Services: []*sandboxv1.Service{{Port: 8080, Name: "web", Protocol: sandboxv1.ServiceProtocol_SERVICE_PROTOCOL_TCP,
			Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC, Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS,
				Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN, RequestTimeoutSeconds: 60}}},
		MaxLifetimeSeconds:    3600,
		Tags:                  []string{"t"},
		RunnerIds:             []string{"r1"},
		Annotations:           map[string]string{"a": "b"},
		Mode:                  sandboxv1.SandboxMode_SANDBOX_MODE_CKS,
		RuntimeClass:          "runc",
		RuntimeClassSelection: sandboxv1.RuntimeClass_RUNTIME_CLASS_CPU_DEFAULT,
		Network: &sandboxv1.NetworkOptions{
			DnsEgress: sandboxv1.DNSEgressMode_DNS_EGRESS_MODE_ALLOW,
			Egress: []*sandboxv1.EgressRule{
				{Destination: &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}}, Ports: udp(53, 54)},
				{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "example.com"}},
				{Destination: &sandboxv1.EgressRule_Tenant{Tenant: sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG}},
				{Destination: &sandboxv1.EgressRule_Any{Any: true}},
			},
			Ingress: []*sandboxv1.IngressRule{
				{Source: &sandboxv1.IngressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}}, Ports: udp(53, 54)},
				{Source: &sandboxv1.IngressRule_Tenant{Tenant: sandboxv1.TenantScope_TENANT_SCOPE_SAME_ORG}},
				{Source: &sandboxv1.IngressRule_Any{Any: true}},
			},
		},
	}, {
		Containers: []*sandboxv1.Container{{Image: "busybox", Resources: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi"}}},
		Network:    &sandboxv1.NetworkOptions{DenyEgress: proto.Bool(true), DenyIngress: proto.Bool(true)},
	}, {
		// Several containers: the primary is the marked row, not the first.
		Containers: []*sandboxv1.Container{
			{Name: "side", Image: "python", Resources: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi"}},
			{Name: "app", Primary: proto.Bool(true), Image: "busybox", Resources: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi"},
				StartupProbe: &sandboxv1.Probe{Exec: []string{"true"}, PeriodSeconds: 2, TimeoutSeconds: 3, FailureThreshold: 4, InitialDelaySeconds: 5}},
		},
	}}
}

// TestWireFieldsConverted, in the manner of Tailscale's ipn/prefs_test.go, over every
// field of the public SandboxSpec (protoreflect, recursively): each is converted by
// ToCreateRequest (set in a fixture, and clearing it there changes the runner request),
// refused when set (refused), or listed in notConverted with why. A field added to the
// wire API fails here with its path until one of these holds.
func TestWireFieldsConverted(t *testing.T) {
	var leaves []string
	wireLeaves((&sandboxv1.SandboxSpec{}).ProtoReflect().Descriptor(), "", &leaves)
	under := func(keys []string, p string) (string, bool) {
		for _, k := range keys {
			if p == k || strings.HasPrefix(p, k+".") {
				return k, true
			}
		}
		return "", false
	}
	refusedKeys, notConvertedKeys := slices.Collect(maps.Keys(refused)), slices.Collect(maps.Keys(notConverted))

	// converted are the leaves a fixture sets whose clearing changes what
	// ToCreateRequest answers.
	converted := map[string]bool{}
	for i, f := range wireFixtures() {
		want, err := ToCreateRequest(f)
		if err != nil {
			t.Fatalf("fixture %d: %v", i, err)
		}
		for n := 0; ; n++ {
			g := proto.Clone(f).(*sandboxv1.SandboxSpec)
			k := n
			p, ok := clearNth(g.ProtoReflect(), "", &k)
			if !ok {
				break
			}
			if got, err := ToCreateRequest(g); err != nil || !reflect.DeepEqual(got, want) {
				converted[p] = true
			}
		}
	}
	used := map[string]bool{}
	for _, p := range leaves {
		if k, ok := under(refusedKeys, p); ok {
			used[k] = true
			continue
		}
		k, listed := under(notConvertedKeys, p)
		used[k] = used[k] || listed
		switch {
		case listed && converted[p]:
			t.Errorf("sandbox.spec.%s is converted, but notConverted lists %s: delete the entry", p, k)
		case !listed && !converted[p]:
			t.Errorf("sandbox.spec.%s: no fixture shows ToCreateRequest converting it: map it (and set it in wireFixtures), refuse it, or list it in notConverted with why", p)
		}
	}
	for k, code := range refused {
		g := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "busybox"}}}
		if !fillPath(g.ProtoReflect(), strings.Split(k, ".")) {
			t.Errorf("refused lists %s, which is no field of SandboxSpec: delete the entry", k)
			continue
		}
		if _, err := ToCreateRequest(g); connect.CodeOf(err) != code {
			t.Errorf("sandbox.spec.%s set: ToCreateRequest answers %v, want %v", k, err, code)
		}
	}
	for k := range notConverted {
		if !used[k] {
			t.Errorf("notConverted lists %s, which is no field of SandboxSpec: delete the entry", k)
		}
	}
}

// wireLeaves appends the path of every field under d that holds no further fields.
func wireLeaves(d protoreflect.MessageDescriptor, path string, out *[]string) {
	fs := d.Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		p := joinWire(path, string(fd.Name()))
		if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && strings.Count(p, ".") < 8 {
			wireLeaves(fd.Message(), p, out)
			continue
		}
		*out = append(*out, p)
	}
}

// clearNth clears the *n-th populated leaf of m (counting down *n, depth first, in field
// order) and returns its path; ok is false when m has fewer leaves.
func clearNth(m protoreflect.Message, path string, n *int) (string, bool) {
	fs := m.Descriptor().Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		if !m.Has(fd) {
			continue
		}
		p := joinWire(path, string(fd.Name()))
		switch {
		case fd.Kind() == protoreflect.MessageKind && fd.IsList():
			l := m.Get(fd).List()
			for j := range l.Len() {
				if found, ok := clearNth(l.Get(j).Message(), p, n); ok {
					return found, true
				}
			}
			continue
		case fd.Kind() == protoreflect.MessageKind && !fd.IsMap():
			if found, ok := clearNth(m.Get(fd).Message(), p, n); ok {
				return found, true
			}
			continue
		}
		if *n == 0 {
			m.Clear(fd)
			return p, true
		}
		*n--
	}
	return "", false
}

// fillPath sets the field at path under m (creating one element of each list on the
// way, or using the first), and every field under it (wireFill). It reports whether
// path names a field. A field set twice (egress[0].https_hostname when path is
// network.egress.selector) keeps the last value: the oneof member path names.
func fillPath(m protoreflect.Message, path []string) bool {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(path[0]))
	if fd == nil {
		return false
	}
	if len(path) == 1 {
		wireFillField(m, fd)
		return true
	}
	if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
		return false
	}
	if fd.IsList() {
		l := m.Mutable(fd).List()
		if l.Len() == 0 {
			e := l.NewElement()
			// What an element needs to be valid but for the field being set.
			switch em := e.Message(); em.Interface().(type) {
			case *sandboxv1.SandboxVolume:
				em.Set(fd.Message().Fields().ByName("name"), protoreflect.ValueOfString("v"))
			case *sandboxv1.EgressRule:
				em.Set(fd.Message().Fields().ByName("https_hostname"), protoreflect.ValueOfString("example.com"))
			}
			l.Append(e)
		}
		return fillPath(l.Get(0).Message(), path[1:])
	}
	return fillPath(m.Mutable(fd).Message(), path[1:])
}

// wireFill sets every field of m, recursively: strings "s", numbers 7, bools true, the
// first non-zero enum value, one element in lists and maps, the first member of a oneof.
func wireFill(m protoreflect.Message, depth int) {
	fs := m.Descriptor().Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && m.WhichOneof(o) != nil {
			continue
		}
		if fd.Kind() == protoreflect.MessageKind && depth > 8 {
			continue
		}
		wireFillField(m, fd)
	}
}

func wireFillField(m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	switch {
	case fd.IsMap():
		mp := m.Mutable(fd).Map()
		v := mp.NewValue()
		if fd.MapValue().Kind() == protoreflect.MessageKind {
			wireFill(v.Message(), 1)
		} else {
			v = wireScalar(fd.MapValue())
		}
		mp.Set(wireScalar(fd.MapKey()).MapKey(), v)
	case fd.IsList():
		l := m.Mutable(fd).List()
		if fd.Kind() == protoreflect.MessageKind {
			e := l.NewElement()
			wireFill(e.Message(), 1)
			l.Append(e)
		} else {
			l.Append(wireScalar(fd))
		}
	case fd.Kind() == protoreflect.MessageKind:
		wireFill(m.Mutable(fd).Message(), 1)
	default:
		m.Set(fd, wireScalar(fd))
	}
}

func wireScalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("s")
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("s"))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vs := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vs.Get(min(1, vs.Len()-1)).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(7)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(7)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(7)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(7)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1.5)
	}
	panic(fmt.Sprintf("wireScalar: kind %v", fd.Kind()))
}

func joinWire(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
