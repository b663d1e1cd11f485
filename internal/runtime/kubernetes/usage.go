package kubernetes

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Per-sandbox CPU and memory (status.resource_usage and the cwsandbox_sandbox_cpu_usage_*
// and _memory_* series): the kubelet's stats summary of the sandbox Pod's node
// (GET /api/v1/nodes/NODE/proxy/stats/summary?only_cpu_and_memory=true through the API
// server, as metrics-server asks: no filesystem stats, which a kubelet may fail to read;
// the runner needs get on nodes/proxy), the sandbox's containers' cumulative CPU time (usageCoreNanoSeconds)
// and memory charged (usageBytes, the cgroup's memory.current, as the local backend
// reports; the working set where the kubelet gives only that, as with containerd's CRI
// stats), summed, sampled at the kubelet's time (runtime.Usage.At); the agent's gate is left out. metrics.k8s.io is not used: it gives
// a CPU rate, not the CPU time status.resource_usage carries. One summary per node is
// read at most every statsTTL, when asked (GetSandbox, a scrape). When the kubelet
// cannot be read (no permission, no proxy) the backend logs it once and reports no
// usage (runtime.ErrNotFound: the runner leaves resource_usage empty, the series out).
//
// The memory peak (runtime.Usage.MemoryPeakBytes) is not in the summary: it comes from the
// same kubelet's cAdvisor metrics (GET /api/v1/nodes/NODE/proxy/metrics/cadvisor, read
// with the summary, same permission): container_memory_max_usage_bytes of each sandbox
// container's cgroup (cgroup v1 memory.max_usage_in_bytes, cgroup v2 memory.peak where
// the kernel and the kubelet's cAdvisor have it), found by the container ID the kubelet
// wrote in the Pod's status and the Pod's UID in the cgroup path (cAdvisor's container,
// pod and namespace labels are empty with containerd's raw cgroups). Host-side numbers:
// nothing the sandbox writes. Reported only when every running sandbox container has
// one; else no peak (never a partial sum).

var _ runtime.UsageReader = (*Backend)(nil)

const (
	// statsTTL is how old a node's summary may be before it is read again.
	statsTTL = 10 * time.Second
	// statsFirstWait is how long Usage waits for a node's first summary.
	statsFirstWait = 2 * time.Second
	// statsForget drops a node's summary nobody asked for this long.
	statsForget = 5 * time.Minute
	// statsRetry is how long a failed read holds off the next one of that node.
	statsRetry = time.Minute
	// maxStatsBytes bounds a summary read (a node of 110 Pods sends well under 1 MiB).
	maxStatsBytes = 16 << 20
	// maxStatsPods bounds the Pods of one summary that are kept, maxStatsContainers
	// the containers of one Pod.
	maxStatsPods       = 4096
	maxStatsContainers = 64
	// statsTimeout bounds one read.
	statsTimeout = 10 * time.Second
)

// NodeStatsFunc reads a node's kubelet stats summary (/stats/summary, JSON).
type NodeStatsFunc func(ctx context.Context, node string) (io.ReadCloser, error)

// statsCache holds the last summary of each node, by name.
type statsCache struct {
	mu         sync.Mutex
	nodes      map[string]*nodeStats
	warned     bool // a failed read was logged; cleared by the next good one
	peakWarned bool // the same, of the cAdvisor metrics
}

type nodeStats struct {
	at, asked time.Time              // read (zero: never), last asked for
	retryAt   time.Time              // after a failure: no read before
	pods      map[types.UID]podUsage // this namespace's Pods
	peaks     map[string]memPeak     // container cgroups' memory peaks by container ID (nil: none read)
	fetching  chan struct{}          // non-nil while a read runs; closed when it ends
}

// podUsage is one Pod's containers' usage, by container name.
type podUsage map[string]runtime.Usage

// Usage implements runtime.UsageReader: the sandbox's containers' usage from the
// kubelet's summary of its node. ErrNotFound when the sandbox is not running on a node
// or the kubelet's numbers cannot be had.
func (b *Backend) Usage(id string) (runtime.Usage, error) {
	s, err := b.get(id)
	if err != nil {
		return runtime.Usage{}, err
	}
	b.mu.Lock()
	pod := s.pod
	b.mu.Unlock()
	if pod == nil || pod.Spec.NodeName == "" || pod.Status.Phase != corev1.PodRunning {
		return runtime.Usage{}, fmt.Errorf("%w: sandbox %s is not running on a node", runtime.ErrNotFound, id)
	}
	pu, peaks, ok := b.podUsage(pod.Spec.NodeName, pod.UID)
	if !ok {
		return runtime.Usage{}, fmt.Errorf("%w: no usage of sandbox %s from its node's kubelet", runtime.ErrNotFound, id)
	}
	var total runtime.Usage
	n := 0
	for name, u := range pu {
		if helperContainer(name) {
			continue
		}
		total.CPUUsec += u.CPUUsec
		total.MemoryBytes += u.MemoryBytes
		if u.At.After(total.At) {
			total.At = u.At
		}
		n++
	}
	if n == 0 {
		return runtime.Usage{}, fmt.Errorf("%w: no container usage of sandbox %s yet", runtime.ErrNotFound, id)
	}
	if p := podPeak(pod, peaks); p > 0 {
		// Sampled apart from the summary: a peak is never below the usage seen.
		total.MemoryPeakBytes = max(p, total.MemoryBytes)
	}
	return total, nil
}

// memPeak is one cgroup's memory peak as the kubelet's cAdvisor reports it.
type memPeak struct {
	cgroup string // cAdvisor's id: the cgroup path
	bytes  int64
}

// podPeak is the sum of the memory peaks of pod's running sandbox containers (not the
// agent's), 0 when one of them has none in peaks: each container is found by the ID
// the kubelet wrote in the Pod's status, and its cgroup must lie under the Pod's (the
// Pod's UID in its path).
func podPeak(pod *corev1.Pod, peaks map[string]memPeak) int64 {
	if len(peaks) == 0 {
		return 0
	}
	uid := string(pod.UID)
	if uid == "" {
		return 0
	}
	uidSystemd := strings.ReplaceAll(uid, "-", "_")
	var sum int64
	n := 0
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for i := range list {
			cs := &list[i]
			if helperContainer(cs.Name) || cs.State.Running == nil {
				continue
			}
			_, cid, ok := strings.Cut(cs.ContainerID, "://")
			if !ok {
				return 0
			}
			p, ok := peaks[cid]
			if !ok || !(strings.Contains(p.cgroup, "pod"+uid) || strings.Contains(p.cgroup, "pod"+uidSystemd)) {
				return 0
			}
			if p.bytes > maxStatsValue-sum {
				return 0
			}
			sum += p.bytes
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum
}

// podUsage is Pod uid's usage from node's summary, read again when older than statsTTL,
// and the node's container memory peaks (nil: none).
func (b *Backend) podUsage(node string, uid types.UID) (podUsage, map[string]memPeak, bool) {
	if len(validation.IsDNS1123Subdomain(node)) > 0 {
		return nil, nil, false
	}
	c := &b.stats
	now := time.Now()
	c.mu.Lock()
	if c.nodes == nil {
		c.nodes = map[string]*nodeStats{}
	}
	for n, ns := range c.nodes {
		if now.Sub(ns.asked) > statsForget && ns.fetching == nil {
			delete(c.nodes, n)
		}
	}
	ns := c.nodes[node]
	if ns == nil {
		ns = &nodeStats{}
		c.nodes[node] = ns
	}
	ns.asked = now
	if ns.fetching == nil && now.Sub(ns.at) >= statsTTL && !now.Before(ns.retryAt) {
		ns.fetching = make(chan struct{})
		go b.fetchStats(node, ns)
	}
	wait := ns.fetching
	first := ns.at.IsZero()
	c.mu.Unlock()
	if first && wait != nil {
		select {
		case <-wait:
		case <-time.After(statsFirstWait):
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	pu, ok := ns.pods[uid]
	return pu, ns.peaks, ok
}

// fetchStats reads node's summary into ns.
func (b *Backend) fetchStats(node string, ns *nodeStats) {
	ctx, cancel := context.WithTimeout(b.ctx, statsTimeout)
	defer cancel()
	pods, err := b.readStats(ctx, node)
	var peaks map[string]memPeak
	var perr error
	if err == nil {
		peaks, perr = b.readPeaks(ctx, node)
	}
	c := &b.stats
	c.mu.Lock()
	defer c.mu.Unlock()
	defer func() { close(ns.fetching); ns.fetching = nil }()
	if err != nil {
		ns.retryAt = time.Now().Add(statsRetry)
		if !c.warned && b.ctx.Err() == nil {
			c.warned = true
			hint := ""
			if apierrors.IsForbidden(err) {
				hint = " (the runner needs get on nodes/proxy)"
			}
			b.log.Warn("per-sandbox usage of the kubernetes backend unavailable: cannot read the kubelet's stats summary"+hint+"; status.resource_usage stays empty", "node", node, "err", err)
		}
		return
	}
	if c.warned {
		b.log.Info("per-sandbox usage of the kubernetes backend available again", "node", node)
	}
	c.warned = false
	ns.at, ns.pods, ns.peaks = time.Now(), pods, peaks
	switch {
	case perr != nil && !c.peakWarned && b.ctx.Err() == nil:
		c.peakWarned = true
		b.log.Warn("memory peaks of the kubernetes backend unavailable: cannot read the kubelet's cAdvisor metrics; status.resource_usage has no memory peak", "node", node, "err", perr)
	case perr == nil && c.peakWarned:
		c.peakWarned = false
		b.log.Info("memory peaks of the kubernetes backend available again", "node", node)
	}
}

// Bounds of a cAdvisor metrics read.
const (
	maxCadvisorBytes = 64 << 20 // a node of 110 Pods sends a few MiB
	maxCadvisorLine  = 64 << 10
	maxPeaks         = 16384
	maxCgroupPath    = 4096
)

// readPeaks reads node's cAdvisor metrics: the memory peaks of its container cgroups.
func (b *Backend) readPeaks(ctx context.Context, node string) (map[string]memPeak, error) {
	read := b.cfg.NodeMetrics
	if read == nil {
		read = func(ctx context.Context, node string) (io.ReadCloser, error) {
			return b.cfg.Client.CoreV1().RESTClient().Get().
				AbsPath("/api/v1/nodes", node, "proxy", "metrics", "cadvisor").Stream(ctx)
		}
	}
	rc, err := read(ctx, node)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return parsePeaks(io.LimitReader(rc, maxCadvisorBytes))
}

// maxUsagePrefix starts each sample line of cAdvisor's memory peak.
const maxUsagePrefix = "container_memory_max_usage_bytes{"

// parsePeaks reads cAdvisor's Prometheus text: each container cgroup's
// container_memory_max_usage_bytes by its container ID (the last element of the cgroup
// path: ID, cri-containerd-ID.scope, crio-ID.scope or docker-ID.scope), at most maxPeaks;
// lines that do not parse, zero peaks and cgroups that are not a container's are left out.
// A line over maxCadvisorLine is skipped (one long line of another metric family must
// not cost every sandbox of the node its peak).
func parsePeaks(r io.Reader) (map[string]memPeak, error) {
	br := bufio.NewReaderSize(r, maxCadvisorLine)
	out := map[string]memPeak{}
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) { // the rest of the over-long line
				_, err = br.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("kubelet cAdvisor metrics: %w", err)
			}
			if err != nil {
				return out, nil
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("kubelet cAdvisor metrics: %w", err)
		}
		if len(out) < maxPeaks && bytes.HasPrefix(line, []byte(maxUsagePrefix)) {
			if id, v, ok := parseMaxUsage(strings.TrimRight(string(line), "\r\n")); ok && v > 0 {
				if cid, ok := containerOfCgroup(id); ok {
					out[cid] = memPeak{cgroup: id, bytes: v}
				}
			}
		}
		if err != nil { // io.EOF
			return out, nil
		}
	}
}

// parseMaxUsage reads one sample line `container_memory_max_usage_bytes{L="V",…} VALUE
// [TIMESTAMP]`: its id label and its value (an integer within maxStatsValue).
func parseMaxUsage(line string) (id string, v int64, ok bool) {
	rest, ok := strings.CutPrefix(line, maxUsagePrefix)
	if !ok {
		return "", 0, false
	}
	for labels := 0; ; labels++ {
		if r, ok := strings.CutPrefix(rest, "}"); ok {
			rest = r
			break
		}
		if labels >= 64 {
			return "", 0, false
		}
		i := strings.Index(rest, `="`)
		if i <= 0 || i > 128 {
			return "", 0, false
		}
		name := rest[:i]
		rest = rest[i+2:]
		var val strings.Builder
		closed := false
		j := 0
		for ; j < len(rest); j++ {
			c := rest[j]
			if c == '\\' {
				j++
				if j >= len(rest) {
					return "", 0, false
				}
				switch rest[j] {
				case 'n':
					val.WriteByte('\n')
				case '\\', '"':
					val.WriteByte(rest[j])
				default:
					return "", 0, false
				}
				continue
			}
			if c == '"' {
				closed = true
				break
			}
			val.WriteByte(c)
		}
		if !closed {
			return "", 0, false
		}
		rest = rest[j+1:]
		if name == "id" {
			id = val.String()
		}
		if r, ok := strings.CutPrefix(rest, ","); ok {
			rest = r
		} else if !strings.HasPrefix(rest, "}") {
			return "", 0, false
		}
	}
	rest, ok = strings.CutPrefix(rest, " ")
	if !ok || id == "" || len(id) > maxCgroupPath {
		return "", 0, false
	}
	num, _, _ := strings.Cut(rest, " ")
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > maxStatsValue || f != math.Trunc(f) {
		return "", 0, false
	}
	return id, int64(f), true
}

// containerOfCgroup is the container ID that names the last element of cgroup path id:
// the ID itself (cgroupfs), or cri-containerd-ID.scope, crio-ID.scope, docker-ID.scope
// (systemd); an ID is 1 to 128 lower-case hex digits.
func containerOfCgroup(id string) (string, bool) {
	last := path.Base(id)
	if s, ok := strings.CutSuffix(last, ".scope"); ok {
		last = ""
		for _, pre := range []string{"cri-containerd-", "crio-", "docker-"} {
			if cid, ok := strings.CutPrefix(s, pre); ok {
				last = cid
				break
			}
		}
	}
	if len(last) == 0 || len(last) > 128 {
		return "", false
	}
	for i := 0; i < len(last); i++ {
		if c := last[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return last, true
}

// readStats reads and parses node's summary: the usage of this namespace's Pods.
func (b *Backend) readStats(ctx context.Context, node string) (map[types.UID]podUsage, error) {
	read := b.cfg.NodeStats
	if read == nil {
		read = func(ctx context.Context, node string) (io.ReadCloser, error) {
			return b.cfg.Client.CoreV1().RESTClient().Get().
				AbsPath("/api/v1/nodes", node, "proxy", "stats", "summary").
				Param("only_cpu_and_memory", "true").Stream(ctx)
		}
	}
	rc, err := read(ctx, node)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return parseSummary(io.LimitReader(rc, maxStatsBytes), b.cfg.Namespace)
}

// summary is the part of the kubelet's stats summary (k8s.io/kubelet/pkg/apis/stats/v1alpha1)
// that is read.
type summary struct {
	Pods []struct {
		PodRef struct {
			Namespace string `json:"namespace"`
			UID       string `json:"uid"`
		} `json:"podRef"`
		Containers []struct {
			Name string `json:"name"`
			CPU  *struct {
				Time                 time.Time `json:"time"`
				UsageCoreNanoSeconds *uint64   `json:"usageCoreNanoSeconds"`
			} `json:"cpu"`
			Memory *struct {
				UsageBytes      *uint64 `json:"usageBytes"`
				WorkingSetBytes *uint64 `json:"workingSetBytes"`
			} `json:"memory"`
		} `json:"containers"`
	} `json:"pods"`
}

// maxStatsValue bounds a number taken from the kubelet (a larger one is not kept).
const maxStatsValue = 1 << 62

// parseSummary reads a stats summary: the usage of namespace's Pods' containers that
// report CPU time (at most maxStatsPods Pods).
func parseSummary(r io.Reader, namespace string) (map[types.UID]podUsage, error) {
	var sum summary
	if err := json.NewDecoder(r).Decode(&sum); err != nil {
		return nil, fmt.Errorf("kubelet stats summary: %w", err)
	}
	out := map[types.UID]podUsage{}
	for _, p := range sum.Pods {
		if p.PodRef.Namespace != namespace || p.PodRef.UID == "" {
			continue
		}
		if len(out) >= maxStatsPods {
			break
		}
		pu := podUsage{}
		for _, c := range p.Containers {
			if len(pu) >= maxStatsContainers {
				break
			}
			if c.CPU == nil || c.CPU.UsageCoreNanoSeconds == nil || *c.CPU.UsageCoreNanoSeconds > maxStatsValue || len(c.Name) > 63 {
				continue
			}
			u := runtime.Usage{CPUUsec: int64(*c.CPU.UsageCoreNanoSeconds / 1000), At: c.CPU.Time}
			if m := c.Memory; m != nil {
				// usageBytes (memory.current) where the kubelet has it (cAdvisor); the CRI's
				// container stats (containerd) give only the working set.
				mem := m.UsageBytes
				if mem == nil {
					mem = m.WorkingSetBytes
				}
				if mem != nil && *mem <= maxStatsValue {
					u.MemoryBytes = int64(*mem)
				}
			}
			pu[c.Name] = u
		}
		out[types.UID(p.PodRef.UID)] = pu
	}
	return out, nil
}
