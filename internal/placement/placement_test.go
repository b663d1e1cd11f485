package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
)

const gi = int64(1) << 30

func mustPolicy(t testing.TB, doc string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func spec(cpu, mem string, pins ...string) *sandboxv1.SandboxSpec {
	c := &sandboxv1.Container{Name: "main", Image: "docker.io/library/busybox:latest"}
	if cpu != "" || mem != "" {
		c.Resources = &sandboxv1.Resources{Cpu: cpu, Memory: mem}
	}
	return &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{c}, RunnerIds: pins}
}

// rn is a ready runner with 4 CPUs, 8 GiB and room for 10 sandboxes.
func rn(id string, p *policy.Policy) Runner {
	return Runner{ID: id, Ready: true, Policy: p, PolicyRevision: "1", Room: Room{Allocatable: Resources{MilliCPU: 4000, MemoryBytes: 8 * gi}, MaxSandboxes: 10}}
}

// overcommit lets r admit CPU requests up to f times its CPUs.
func overcommit(r Runner, f float64) Runner { r.CPUOvercommit = f; return r }

func used(r Runner, cpu int64, mem int64, n int) Runner {
	r.Used, r.Sandboxes = Resources{MilliCPU: cpu, MemoryBytes: mem}, n
	return r
}

func down(r Runner) Runner { r.Ready, r.NotReady = false, "no heartbeat"; return r }

func ids(cs []Candidate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.RunnerID
	}
	return out
}

func TestPlace(t *testing.T) {
	strict := mustPolicy(t, `{"constraints": {"resources": {"max_cpu": "1", "max_memory": "1Gi"}}}`)
	registry := mustPolicy(t, `{"constraints": {"images": {"allowed_registries": ["ghcr.io"]}}}`)
	free := mustPolicy(t, `{}`)
	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprint("r", i)
	}
	tests := []struct {
		name    string
		spec    *sandboxv1.SandboxSpec
		runners []Runner
		want    []string // candidates in order (unordered when ties)
		ties    bool
		code    connect.Code
		reason  string
		fields  []string // every violation field (order-free)
		retry   bool
	}{
		{name: "policy filters", spec: spec("2", "1Gi"), runners: []Runner{rn("r1", strict), rn("r2", free)}, want: []string{"r2"}},
		{name: "least loaded first", spec: spec("1", "1Gi"), runners: []Runner{used(rn("r1", free), 3000, gi, 1), used(rn("r2", free), 1000, gi, 1)}, want: []string{"r2", "r1"}},
		{name: "memory load counts", spec: spec("1", "1Gi"), runners: []Runner{used(rn("r1", free), 0, 6*gi, 1), used(rn("r2", free), 2000, 0, 1)}, want: []string{"r2", "r1"}},
		{name: "slot load counts", spec: spec("", ""), runners: []Runner{used(rn("r1", free), 0, 0, 8), used(rn("r2", free), 0, 0, 1)}, want: []string{"r2", "r1"}},
		{name: "spill when full", spec: spec("2", "1Gi"), runners: []Runner{used(rn("r1", free), 3000, 0, 1), used(rn("r2", free), 3500, 0, 1)}, code: connect.CodeResourceExhausted, reason: apierr.RunnerCapacityExhausted, retry: true},
		{name: "spill to the one with room", spec: spec("2", "1Gi"), runners: []Runner{used(rn("r1", free), 3000, 0, 1), rn("r2", free)}, want: []string{"r2"}},
		{name: "sandbox count limit", spec: spec("", ""), runners: []Runner{used(rn("r1", free), 0, 0, 10), used(rn("r2", free), 0, 0, 9)}, want: []string{"r2"}},
		{name: "memory does not fit now", spec: spec("100m", "5Gi"), runners: []Runner{used(rn("r1", free), 0, 4*gi, 1)}, code: connect.CodeResourceExhausted, reason: apierr.RunnerCapacityExhausted, retry: true},
		{name: "memory never fits", spec: spec("100m", "9Gi"), runners: []Runner{rn("r1", free)}, code: connect.CodeFailedPrecondition, reason: apierr.NoSuitableRunner,
			fields: []string{"runner[r1].sandbox.spec.containers[0].resources.memory"}},
		{name: "gpu never fits", spec: &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "busybox", Resources: &sandboxv1.Resources{Gpu: &sandboxv1.Gpu{Count: 1}}}}}, runners: []Runner{rn("r1", free)}, code: connect.CodeFailedPrecondition, reason: apierr.NoSuitableRunner,
			fields: []string{"runner[r1].sandbox.spec.containers[0].resources.gpu.count"}},
		{name: "cpu never fits on any runner, even idle", spec: spec("64", "1Gi"), runners: []Runner{rn("r1", free), overcommit(rn("r2", free), 100)}, code: connect.CodeFailedPrecondition, reason: apierr.NoSuitableRunner,
			fields: []string{"runner[r1].sandbox.spec.containers[0].resources.cpu", "runner[r2].sandbox.spec.containers[0].resources.cpu"}},
		{name: "never here, room later there", spec: spec("3", ""), runners: []Runner{func() Runner { r := rn("r1", free); r.Allocatable.MilliCPU = 2000; return r }(), used(rn("r2", free), 3500, 0, 1)},
			code: connect.CodeResourceExhausted, reason: apierr.RunnerCapacityExhausted, retry: true},
		{name: "never here, fits there", spec: spec("3", ""), runners: []Runner{func() Runner { r := rn("r1", free); r.Allocatable.MilliCPU = 2000; return r }(), rn("r2", free)}, want: []string{"r2"}},
		{name: "never fits one, policy rejects the other", spec: spec("8", "512Mi"), runners: []Runner{rn("r1", free), rn("r2", strict)}, code: connect.CodeFailedPrecondition, reason: apierr.NoSuitableRunner,
			fields: []string{"runner[r1].sandbox.spec.containers[0].resources.cpu", "runner[r2].sandbox.spec.containers[0].resources.cpu"}},
		{name: "requests count, not limits", spec: &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "busybox", ResourceRequirements: &sandboxv1.ResourceRequirements{
			Requests: &sandboxv1.Resources{Cpu: "500m"}, Limits: &sandboxv1.Resources{Cpu: "4"}}}}}, runners: []Runner{used(rn("r1", free), 3500, 0, 1)}, want: []string{"r1"}},
		{name: "overcommitted cpu admits", spec: spec("1", ""), runners: []Runner{overcommit(used(rn("r1", free), 7000, 0, 1), 2)}, want: []string{"r1"}},
		{name: "overcommitted cpu full", spec: spec("1", ""), runners: []Runner{overcommit(used(rn("r1", free), 7500, 0, 1), 2)}, code: connect.CodeResourceExhausted, reason: apierr.RunnerCapacityExhausted, retry: true},
		{name: "unreported cpu is not checked", spec: spec("64", ""), runners: []Runner{{ID: "r1", Ready: true}}, want: []string{"r1"}},
		{name: "pin narrows", spec: spec("100m", "", "r1"), runners: []Runner{rn("r1", free), rn("r2", free)}, want: []string{"r1"}},
		{name: "pin to a strict runner", spec: spec("2", "512Mi", "r1"), runners: []Runner{rn("r1", strict), rn("r2", free)}, code: connect.CodeInvalidArgument, reason: apierr.PlacementRejected, fields: []string{"sandbox.spec.containers[0].resources.cpu"}},
		{name: "single runner keeps INVALID_ARGUMENT", spec: spec("2", "2Gi"), runners: []Runner{rn("r1", strict)}, code: connect.CodeInvalidArgument, reason: apierr.PlacementRejected,
			fields: []string{"sandbox.spec.containers[0].resources.cpu", "sandbox.spec.containers[0].resources.memory"}},
		{name: "no policy accepts", spec: spec("2", "512Mi"), runners: []Runner{rn("r1", strict), rn("r2", registry)}, code: connect.CodeFailedPrecondition, reason: apierr.NoSuitableRunner,
			fields: []string{"runner[r1].sandbox.spec.containers[0].resources.cpu", "runner[r2].sandbox.spec.containers[0].image"}},
		{name: "rejecting and down", spec: spec("2", "512Mi"), runners: []Runner{rn("r1", strict), down(rn("r2", free))}, code: connect.CodeFailedPrecondition, reason: apierr.NoSuitableRunner,
			fields: []string{"runner[r1].sandbox.spec.containers[0].resources.cpu", "runner[r2]"}},
		{name: "down runner skipped", spec: spec("", ""), runners: []Runner{down(rn("r1", free)), rn("r2", free)}, want: []string{"r2"}},
		{name: "pinned runners down", spec: spec("", "", "r1", "r2"), runners: []Runner{down(rn("r1", free)), down(rn("r2", free)), rn("r3", free)}, code: connect.CodeUnavailable, reason: apierr.RunnerUnavailable, retry: true},
		{name: "all down", spec: spec("", ""), runners: []Runner{down(rn("r1", free))}, code: connect.CodeUnavailable, reason: apierr.RunnerUnavailable, retry: true},
		{name: "full beats rejected", spec: spec("1", ""), runners: []Runner{used(rn("r1", free), 4000, 0, 1), rn("r2", registry)}, code: connect.CodeResourceExhausted, reason: apierr.RunnerCapacityExhausted, retry: true},
		{name: "unknown pin", spec: spec("", "", "nope"), runners: []Runner{rn("r1", free)}, code: connect.CodeFailedPrecondition, reason: apierr.NoSuitableRunner},
		{name: "blank pin", spec: spec("", "", " "), runners: []Runner{rn("r1", free)}, code: connect.CodeInvalidArgument, reason: apierr.InvalidRequest, fields: []string{"sandbox.spec.runner_ids[0]"}},
		{name: "duplicate pin", spec: spec("", "", "r1", "r1"), runners: []Runner{rn("r1", free)}, code: connect.CodeInvalidArgument, reason: apierr.InvalidRequest, fields: []string{"sandbox.spec.runner_ids[1]"}},
		{name: "too many pins", spec: spec("", "", many...), runners: []Runner{rn("r1", free)}, code: connect.CodeInvalidArgument, reason: apierr.InvalidRequest, fields: []string{"sandbox.spec.runner_ids"}},
		{name: "ties", spec: spec("1", ""), runners: []Runner{rn("r1", free), rn("r2", free), rn("r3", free)}, want: []string{"r1", "r2", "r3"}, ties: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands, err := Place(Request{Spec: tt.spec, Runners: tt.runners, Platform: policy.DefaultPlatform(), Rand: rand.New(rand.NewPCG(1, 2))})
			if tt.reason != "" {
				if err == nil {
					t.Fatalf("placed on %v, want %s", ids(cands), tt.reason)
				}
				if connect.CodeOf(err) != tt.code || apierr.Reason(err) != tt.reason {
					t.Fatalf("error %v (%s), want %v %s", err, apierr.Reason(err), tt.code, tt.reason)
				}
				var got []string
				for _, v := range apierr.Violations(err) {
					got = append(got, v.Field)
				}
				slices.Sort(got)
				want := slices.Clone(tt.fields)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("violation fields %v, want %v", got, want)
				}
				if d := apierr.RetryInfo(err).GetRetryDelay().AsDuration(); tt.retry != (d > 0) {
					t.Errorf("retry delay %v, want retry %v", d, tt.retry)
				}
				return
			}
			if err != nil {
				t.Fatalf("place: %v", err)
			}
			got := ids(cands)
			if tt.ties {
				slices.Sort(got)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("candidates %v, want %v", got, tt.want)
			}
			for _, c := range cands {
				if !c.Result.OK() || c.Result.Spec == nil || c.Result.PolicyRevision != "1" && tt.runners[c.Index].PolicyRevision == "1" {
					t.Errorf("candidate %s: result %+v", c.RunnerID, c.Result)
				}
			}
		})
	}
}

func TestTiesAreRandom(t *testing.T) {
	runners := []Runner{rn("r1", nil), rn("r2", nil), rn("r3", nil)}
	firsts := map[string]int{}
	rnd := rand.New(rand.NewPCG(7, 7))
	for range 300 {
		cands, err := Place(Request{Spec: spec("1", ""), Runners: runners, Platform: policy.DefaultPlatform(), Rand: rnd})
		if err != nil {
			t.Fatal(err)
		}
		firsts[cands[0].RunnerID]++
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		if firsts[id] < 50 {
			t.Errorf("tie broken unevenly: %v", firsts)
		}
	}
}

func TestNeed(t *testing.T) {
	s := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{
		{Resources: &sandboxv1.Resources{Cpu: "500m", Memory: "1Gi", Gpu: &sandboxv1.Gpu{Count: 2}}},
		{ResourceRequirements: &sandboxv1.ResourceRequirements{Limits: &sandboxv1.Resources{Cpu: "1"}, Requests: &sandboxv1.Resources{Cpu: "250m", Memory: "256Mi"}}},
		{},
	}}
	got := Need(s, Resources{MilliCPU: 100, MemoryBytes: 1 << 20})
	want := Resources{MilliCPU: 500 + 250 + 100, MemoryBytes: gi + 256<<20 + 1<<20, GPUs: 2}
	if got != want {
		t.Errorf("Need = %+v, want %+v", got, want)
	}
}

func TestPolicyDefaultsCount(t *testing.T) {
	// The policy base gives a limit, which is also the request: the resolved spec, not
	// the asked one, is measured.
	p := mustPolicy(t, `{"base": {"resources": {"limits": {"cpu": "3"}}}}`)
	cands, err := Place(Request{Spec: spec("", ""), Runners: []Runner{rn("r1", p)}, Platform: policy.DefaultPlatform()})
	if err != nil || cands[0].Need.MilliCPU != 3000 {
		t.Fatalf("place: %v %+v", err, cands)
	}
	_, err = Place(Request{Spec: spec("", ""), Runners: []Runner{used(rn("r1", p), 2000, 0, 1)}, Platform: policy.DefaultPlatform()})
	if apierr.Reason(err) != apierr.RunnerCapacityExhausted || !strings.Contains(err.Error(), "needs 3 CPU") {
		t.Errorf("place on a busy runner: %v", err)
	}
}

func TestReservationsSpread(t *testing.T) {
	var rs Reservations
	runners := []Runner{rn("r1", nil), rn("r2", nil)}
	req := Request{Spec: spec("2", "1Gi"), Runners: runners, Platform: policy.DefaultPlatform(), Reservations: &rs}
	var releases []func()
	var got []string
	for range 4 {
		cands, err := Place(req)
		if err != nil {
			t.Fatalf("place %d: %v", len(got), err)
		}
		release, ok := rs.Claim(cands[0])
		if !ok {
			t.Fatalf("claim %s failed", cands[0].RunnerID)
		}
		releases = append(releases, release)
		got = append(got, cands[0].RunnerID)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"r1", "r1", "r2", "r2"}) {
		t.Errorf("placements %v, want two per runner", got)
	}
	if _, err := Place(req); apierr.Reason(err) != apierr.RunnerCapacityExhausted || apierr.RetryInfo(err).GetRetryDelay().AsDuration() != RetryAfter {
		t.Errorf("fifth placement: %v, want %s with RetryInfo", err, apierr.RunnerCapacityExhausted)
	}
	releases[0]()
	releases[0]() // idempotent
	if res, n := rs.Held(got[0]); n+2 > 4 || res.MilliCPU < 0 {
		t.Errorf("held after release: %+v %d", res, n)
	}
	if _, err := Place(req); err != nil {
		t.Errorf("placement after a release: %v", err)
	}
	for _, r := range releases {
		r()
	}
	for _, id := range []string{"r1", "r2"} {
		if res, n := rs.Held(id); n != 0 || res != (Resources{}) {
			t.Errorf("%s holds %+v (%d) after every release", id, res, n)
		}
	}
}

func TestClaimRaces(t *testing.T) {
	// Concurrent creates: each places, then claims; a stale candidate fails its claim
	// and never oversubscribes the runner.
	var rs Reservations
	runners := []Runner{rn("r1", nil), rn("r2", nil)}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		placed  = map[string]int{}
		refused int
	)
	for range 16 {
		wg.Go(func() {
			cands, err := Place(Request{Spec: spec("1", "1Gi"), Runners: runners, Platform: policy.DefaultPlatform(), Reservations: &rs})
			if err != nil {
				mu.Lock()
				refused++
				mu.Unlock()
				return
			}
			for _, c := range cands {
				if _, ok := rs.Claim(c); ok { // never released: the runner keeps it
					mu.Lock()
					placed[c.RunnerID]++
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			refused++
			mu.Unlock()
		})
	}
	wg.Wait()
	if placed["r1"] != 4 || placed["r2"] != 4 || refused != 8 {
		t.Errorf("placed %v, refused %d; want 4 per runner (4 CPUs each) and 8 refused", placed, refused)
	}
}

func TestReserveUnconditional(t *testing.T) {
	var rs Reservations
	release := rs.Reserve("r1", Resources{MilliCPU: 4000})
	_, err := Place(Request{Spec: spec("1", ""), Runners: []Runner{rn("r1", nil)}, Platform: policy.DefaultPlatform(), Reservations: &rs})
	if apierr.Reason(err) != apierr.RunnerCapacityExhausted {
		t.Errorf("place on a reserved runner: %v", err)
	}
	release()
	if _, err := Place(Request{Spec: spec("1", ""), Runners: []Runner{rn("r1", nil)}, Platform: policy.DefaultPlatform(), Reservations: &rs}); err != nil {
		t.Errorf("after release: %v", err)
	}
}

// BenchmarkPlace decides for one sandbox among 100 runners with 10 distinct realistic
// policies (resource ceilings, registries, lifetimes, base defaults), each runner
// partly used.
func BenchmarkPlace(b *testing.B) {
	for _, distinct := range []int{10, 100} {
		b.Run(fmt.Sprintf("policies=%d", distinct), func(b *testing.B) {
			pols := make([]*policy.Policy, distinct)
			for i := range pols {
				pols[i] = mustPolicy(b, fmt.Sprintf(`{
					"base": {"max_lifetime_seconds": 900, "env": {"TEAM": "t%d"}, "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
					"constraints": {
						"lifetime": {"max_seconds": %d},
						"resources": {"max_cpu": "%d", "max_memory": "%dGi"},
						"images": {"allowed_registries": ["docker.io", "ghcr.io", "registry%d.example.com"]},
						"services": {"max_services": 3},
						"annotations": {"max_count": 10, "denied_prefixes": ["kubernetes.io/"]}
					}}`, i, 3600*(1+i%4), 1+i%8, 1+i%16, i))
			}
			runners := make([]Runner, 100)
			for i := range runners {
				r := rn(fmt.Sprint("runner-", i), pols[i%distinct])
				r.Allocatable = Resources{MilliCPU: 64000, MemoryBytes: 256 * gi, GPUs: 8}
				r.MaxSandboxes = 200
				runners[i] = used(r, int64(i*500), int64(i)*gi, i)
			}
			s := spec("2", "4Gi")
			s.MaxLifetimeSeconds = 1800
			s.Containers[0].EnvironmentVariables = map[string]string{"A": "1"}
			s.Tags = []string{"bench"}
			var rs Reservations
			req := Request{Spec: s, Runners: runners, Platform: policy.DefaultPlatform(), Reservations: &rs}
			b.ReportAllocs()
			for b.Loop() {
				cands, err := Place(req)
				if err != nil || len(cands) == 0 {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestClaimUpTo: as many of n as fit are held in one step (CPU, then the sandbox count),
// with why all n do not; none fitting holds nothing; the release gives back all k.
func TestClaimUpTo(t *testing.T) {
	var rs Reservations
	r := used(rn("r1", nil), 1000, 2*gi, 7) // 3 CPUs, 6 GiB, 3 sandboxes free
	cands, err := Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{r}, Platform: policy.DefaultPlatform(), Reservations: &rs})
	if err != nil {
		t.Fatal(err)
	}
	c := cands[0]
	for _, n := range []int{1, 2, 3} {
		k, release, why := rs.ClaimUpTo(c, n)
		if k != n || why != "" {
			t.Errorf("ClaimUpTo(%d) with room for 3: %d, %q", n, k, why)
		}
		release()
	}
	k, release, why := rs.ClaimUpTo(c, 100)
	if k != 3 || !strings.Contains(why, "needs 100 CPU, 3 free") {
		t.Errorf("ClaimUpTo(100) with room for 3: %d, %q", k, why)
	}
	if res, n := rs.Held("r1"); n != 3 || res != (Resources{MilliCPU: 3000, MemoryBytes: 3 * gi}) {
		t.Errorf("held %+v (%d), want 3 CPU, 3 GiB, 3 sandboxes", res, n)
	}
	if k, _, why := rs.ClaimUpTo(c, 5); k != 0 || why == "" {
		t.Errorf("ClaimUpTo on a full runner: %d, %q", k, why)
	}
	release()
	release()
	if res, n := rs.Held("r1"); n != 0 || res != (Resources{}) {
		t.Errorf("held %+v (%d) after release", res, n)
	}
	small, _ := Place(Request{Spec: spec("10m", "1Mi"), Runners: []Runner{r}, Platform: policy.DefaultPlatform()})
	if k, rel, why := rs.ClaimUpTo(small[0], 50); k != 3 || !strings.Contains(why, "maximum of 10 sandboxes") {
		t.Errorf("50 small forks with room for 3 sandboxes: %d, %q", k, why)
	} else {
		rel()
	}
}

// TestClaimN: n sandboxes at once (a fork) are held only when all fit: CPU, memory and
// the sandbox count, given earlier reservations; a refusal holds nothing and says why.
func TestClaimN(t *testing.T) {
	var rs Reservations
	r := used(rn("r1", nil), 1000, 2*gi, 7) // 3 CPUs, 6 GiB, 3 sandboxes free
	cands, err := Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{r}, Platform: policy.DefaultPlatform(), Reservations: &rs})
	if err != nil {
		t.Fatal(err)
	}
	c := cands[0]
	if _, why := rs.ClaimN(c, 4); !strings.Contains(why, "needs 4 CPU, 3 free") {
		t.Errorf("4 forks of 1 CPU with 3 free: %q", why)
	}
	if res, n := rs.Held("r1"); n != 0 || res != (Resources{}) {
		t.Errorf("a refused claim holds %+v (%d)", res, n)
	}
	release, why := rs.ClaimN(c, 3)
	if why != "" {
		t.Fatalf("3 forks with room for 3: %s", why)
	}
	if res, n := rs.Held("r1"); n != 3 || res != (Resources{MilliCPU: 3000, MemoryBytes: 3 * gi}) {
		t.Errorf("held %+v (%d), want 3 CPU, 3 GiB, 3 sandboxes", res, n)
	}
	if _, why := rs.ClaimN(c, 1); why == "" {
		t.Error("a fourth sandbox fitted on a full runner")
	}
	release()
	release()
	if res, n := rs.Held("r1"); n != 0 || res != (Resources{}) {
		t.Errorf("held %+v (%d) after release", res, n)
	}
	// The sandbox count alone: room for 3 more sandboxes.
	small, _ := Place(Request{Spec: spec("10m", "1Mi"), Runners: []Runner{r}, Platform: policy.DefaultPlatform()})
	if _, why := rs.ClaimN(small[0], 4); !strings.Contains(why, "maximum of 10 sandboxes") {
		t.Errorf("4 small forks with room for 3 sandboxes: %q", why)
	}
	if rel, why := rs.ClaimN(small[0], 3); why != "" {
		t.Errorf("3 small forks: %s", why)
	} else {
		rel()
	}
}

// Health: a degraded runner (HealthRank) comes after healthy ones whatever its load or
// cache; a quarantined one is no candidate, and when it is the only one left the answer
// is CWSANDBOX_NO_SUITABLE_RUNNER naming the quarantine.
func TestPlaceHealth(t *testing.T) {
	free := mustPolicy(t, `{}`)
	degraded := rn("r1", free) // empty: least loaded
	degraded.HealthRank = 1
	degraded.CachedSnapshots = []string{"d1"}
	busy := used(rn("r2", free), 3000, gi, 3)
	cands, err := Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{degraded, busy}})
	if err != nil || !slices.Equal(ids(cands), []string{"r2", "r1"}) {
		t.Fatalf("degraded not last: %v %v", ids(cands), err)
	}
	PreferCached(cands, []Runner{degraded, busy}, []string{"d1"})
	if !slices.Equal(ids(cands), []string{"r2", "r1"}) {
		t.Fatalf("cache put a degraded runner first: %v", ids(cands))
	}
	q := rn("r1", free)
	q.Quarantined = "quarantined until 2026-01-01T00:00:30Z: 6 failed creates in a row"
	cands, err = Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{q, busy}})
	if err != nil || !slices.Equal(ids(cands), []string{"r2"}) {
		t.Fatalf("quarantined runner placed: %v %v", ids(cands), err)
	}
	// Only quarantined runners would take it: retryable (UNAVAILABLE RUNNER_UNAVAILABLE,
	// as for down runners) with RetryInfo until the earliest cooldown ends, naming the
	// quarantine in a violation.
	q.QuarantineRetry = 20 * time.Second
	q2 := rn("r4", free)
	q2.Quarantined, q2.QuarantineRetry = "quarantined: a probe create is testing it", 0
	for _, rs := range [][]Runner{{q}, {q, rn("r3", mustPolicy(t, `{"constraints": {"resources": {"max_cpu": "0.5"}}}`))}, {q2, q}} {
		_, err = Place(Request{Spec: spec("1", "1Gi"), Runners: rs})
		if apierr.Reason(err) != apierr.RunnerUnavailable || connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "quarantined until") {
			t.Fatalf("%d runners, all acceptable quarantined: %v", len(rs), err)
		}
		if d := apierr.RetryInfo(err).GetRetryDelay().AsDuration(); d != 20*time.Second {
			t.Errorf("%d runners: retry %v, want 20s", len(rs), d)
		}
		if !slices.ContainsFunc(apierr.Violations(err), func(v apierr.Violation) bool {
			return v.Field == "runner[r1]" && strings.Contains(v.Description, "quarantined until")
		}) {
			t.Errorf("%d runners: violations %v", len(rs), apierr.Violations(err))
		}
	}
	// Unknown end (a probe is out): the default retry.
	_, err = Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{q2}})
	if apierr.Reason(err) != apierr.RunnerUnavailable {
		t.Fatalf("probe out: %v", err)
	}
	if d := apierr.RetryInfo(err).GetRetryDelay().AsDuration(); d != RetryAfter {
		t.Errorf("probe out: retry %v, want %s", d, RetryAfter)
	}
}
