package policy

import "fmt"

// ResourcesMisfit lists the policy's resource limits a one-container sandbox whose
// requests and limits are milliCPU and memoryBytes would break (an image build's builder,
// whose size the platform fixes: it is not resolved like a spec): the per-container
// maxima (constraints.resources.max_cpu, max_memory) and the per-sandbox ceilings
// (total_cpu, total_memory). field names the value the caller chose (e.g. builder_size);
// nil when it fits. A limit that does not parse constrains nothing here (Validate refuses
// such a policy when it is saved).
func (p *Policy) ResourcesMisfit(field string, milliCPU, memoryBytes int64) []Violation {
	if p == nil || p.Constraints.Resources == nil {
		return nil
	}
	rc := p.Constraints.Resources
	var out []Violation
	for _, q := range []struct {
		k      kind
		limit  Quantity
		name   string
		want   int64
		across bool
	}{
		{cpu, rc.MaxCPU, "max_cpu", milliCPU, false},
		{cpu, rc.TotalCPU, "total_cpu", milliCPU, true},
		{memory, rc.MaxMemory, "max_memory", memoryBytes, false},
		{memory, rc.TotalMemory, "total_memory", memoryBytes, true},
	} {
		if q.limit == "" {
			continue
		}
		n, err := q.k.parse(string(q.limit))
		if err != nil || q.want <= n {
			continue
		}
		what := "per-container maximum"
		if q.across {
			what = "per-sandbox ceiling"
		}
		v := Violation{Constraint: "constraints.resources." + q.name, Limit: q.k.format(n), Ceiling: q.across}
		v.Field = field
		v.Description = fmt.Sprintf("%s %s is above this runner's %s of %s", q.k, q.k.format(q.want), what, q.k.format(n))
		out = append(out, v)
	}
	return out
}
