package policy

import (
	"slices"
	"strings"
	"testing"
)

func TestValidatePod(t *testing.T) {
	for _, tc := range []struct {
		name, pod string
		fields    []string // the violations' fields; none = valid
	}{
		{"full", `{"node_selector": {"kubernetes.io/os": "linux", "pool": ""}, "tolerations": [
			{"key": "sandboxd.io/dedicated", "operator": "Equal", "value": "sandboxes", "effect": "NoSchedule"},
			{"operator": "Exists"},
			{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "toleration_seconds": 30}],
			"priority_class_name": "sandbox-low", "service_account_name": "sandbox", "image_pull_secrets": ["regcred"],
			"annotations": {"example.com/team": "ml", "note": "any value at all"}}`, nil},
		{"bad node selector", `{"node_selector": {"-bad": "x", "ok/": "y", "zone": "not a value"}}`,
			[]string{`policy.base.pod.node_selector["-bad"]`, `policy.base.pod.node_selector["ok/"]`, `policy.base.pod.node_selector["zone"]`}},
		{"bad tolerations", `{"tolerations": [{"operator": "Equal"}, {"key": "k", "operator": "Exists", "value": "v"},
			{"key": "k", "operator": "Maybe", "effect": "Sometimes"}, {"key": "k", "effect": "NoSchedule", "toleration_seconds": 5}]}`,
			[]string{"policy.base.pod.tolerations[0].operator", "policy.base.pod.tolerations[1].value",
				"policy.base.pod.tolerations[2].operator", "policy.base.pod.tolerations[2].effect", "policy.base.pod.tolerations[3].toleration_seconds"}},
		{"bad names", `{"priority_class_name": "Low", "service_account_name": "a_b", "image_pull_secrets": ["ok", "No"], "annotations": {"a b": "x"}}`,
			[]string{"policy.base.pod.priority_class_name", "policy.base.pod.service_account_name", "policy.base.pod.image_pull_secrets[1]", `policy.base.pod.annotations["a b"]`}},
		// The backend's own keys (sandboxd.io/workload-started marks a GLOBAL writer's
		// workload started) are refused, not dropped; another domain ending in it is not.
		{"reserved annotations", `{"annotations": {"sandboxd.io/workload-started": "true", "sandboxd.io/team": "ml", "example.sandboxd.io/x": "y", "notsandboxd.io/x": "y"}}`,
			[]string{`policy.base.pod.annotations["sandboxd.io/team"]`, `policy.base.pod.annotations["sandboxd.io/workload-started"]`}},
		// gVisor's shim reads mount hints and runsc settings from dev.gvisor.* Pod
		// annotations: refused too.
		{"gvisor annotations", `{"annotations": {"dev.gvisor.spec.mount.run.share": "pod", "dev.gvisor.flag.network": "host", "dev.gvisorx/y": "ok"}}`,
			[]string{`policy.base.pod.annotations["dev.gvisor.flag.network"]`, `policy.base.pod.annotations["dev.gvisor.spec.mount.run.share"]`}},
		// sandboxd's patched gVisor shim restores a Pod from the node's checkpoint named by
		// dev.sandboxd.restore.checkpoint-id: refused (a tenant would resume another's).
		{"shim annotations", `{"annotations": {"dev.sandboxd.restore.checkpoint-id": "cp-1", "dev.sandboxdx/y": "ok"}}`,
			[]string{`policy.base.pod.annotations["dev.sandboxd.restore.checkpoint-id"]`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(`{"base": {"pod": ` + tc.pod + `}}`))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, v := range Validate(p) {
				got = append(got, v.Field)
			}
			if !slices.Equal(got, tc.fields) {
				t.Errorf("violations %q, want %q", got, tc.fields)
			}
		})
	}
	t.Run("resolution carries it", func(t *testing.T) {
		p, err := Parse([]byte(`{"base": {"pod": {"node_selector": {"pool": "a"}}}}`))
		if err != nil {
			t.Fatal(err)
		}
		if res := ResolveRevision(p, "1", spec(), DefaultPlatform()); !res.OK() || res.Pod == nil || res.Pod.NodeSelector["pool"] != "a" {
			t.Errorf("resolution: %+v", res)
		}
		if res := ResolveRevision(&Policy{}, "1", spec(), DefaultPlatform()); res.Pod != nil {
			t.Errorf("no pod settings in the policy, got %+v", res.Pod)
		}
	})
}

// TestValidatePodReservedAnnotation: the refusal names the field and says why.
func TestValidatePodReservedAnnotation(t *testing.T) {
	p, err := Parse([]byte(`{"base": {"pod": {"annotations": {"sandboxd.io/workload-started": "true"}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	vs := Validate(p)
	if len(vs) != 1 || vs[0].Field != `policy.base.pod.annotations["sandboxd.io/workload-started"]` ||
		!strings.Contains(vs[0].Description, `prefix "sandboxd.io/" is reserved`) {
		t.Errorf("violations %+v, want one on the reserved key saying the prefix is reserved", vs)
	}
}
