package policy

import (
	"strings"
	"testing"
)

// TestResourcesMisfit: a builder of 2 CPUs and 2 GiB fits a policy without resource
// limits and one whose limits hold it (equal included); each limit below it is named
// with its constraint and value.
func TestResourcesMisfit(t *testing.T) {
	const cpu2, mem2 = 2000, 2 << 30
	for _, tc := range []struct {
		rc   *ResourceConstraints
		want []string // constraints broken
	}{
		{nil, nil},
		{&ResourceConstraints{MaxCPU: "2", MaxMemory: "2Gi", TotalCPU: "2000m", TotalMemory: "2048Mi"}, nil},
		{&ResourceConstraints{MaxCPU: "1500m"}, []string{"constraints.resources.max_cpu"}},
		{&ResourceConstraints{MaxMemory: "1Gi", TotalCPU: "1"}, []string{"constraints.resources.total_cpu", "constraints.resources.max_memory"}},
		{&ResourceConstraints{TotalMemory: "2047Mi", MaxCPU: "4"}, []string{"constraints.resources.total_memory"}},
		{&ResourceConstraints{MaxCPU: "not a quantity"}, nil},
	} {
		p := &Policy{Constraints: Constraints{Resources: tc.rc}}
		vs := p.ResourcesMisfit("builder_size", cpu2, mem2)
		var got []string
		for _, v := range vs {
			got = append(got, v.Constraint)
			if v.Field != "builder_size" || v.Limit == "" || !strings.Contains(v.Description, v.Limit) {
				t.Errorf("%+v: violation %+v", tc.rc, v)
			}
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%+v: broke %v, want %v", tc.rc, got, tc.want)
		}
	}
	var none *Policy
	if vs := none.ResourcesMisfit("builder_size", cpu2, mem2); vs != nil {
		t.Errorf("nil policy: %v", vs)
	}
}
