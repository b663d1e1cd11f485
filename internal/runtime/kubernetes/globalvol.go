package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// GLOBAL volume copies (runtime.Volume.Global, docs/volumes.md) on Kubernetes.
//
// A copy is a sized emptyDir restored from the volume's committed generation, like a
// scratch volume restored from a snapshot (snapshot.go), and always filled through the
// filler, a runner-owned container of the Pod (containerFiller, the agent image running
// sandbox-agent, never the workload's image), which mounts every restored GLOBAL copy
// writable at fillerDir/<volume index>; so is a restored scratch volume that no
// workload agent can fill alone (snapshot.go fillsInPlace: mounted by sub_path,
// read-only only, or with directories made below its mount), a disk one only
// (planRestores refuses a memory one: its pages would be the filler's). The workload's own mounts
// may then all be read-only. The filler's agent starts in standby; the runner reaches
// it through the gate (TLS server name containerFiller, its own run emptyDir under
// gate.ContainersDir, its own identity, verified on every connection), streams the
// cached archive to it (ExtractPath, bounded by the volume's size), and then starts it
// with `sandbox-gate noop`, which exits at once, and the filler with it: the copy is
// complete before any workload container is started (they are held in standby until
// then). The workload is not held until the filler has terminated: it has accepted that
// final start, so its agent runs nothing more (it is ending), and its socket is only
// in its own run dir and the gate's, which no workload container mounts. The blob store is never reached from the Pod:
// the runner downloads the archive (PrepareSnapshot) and streams it.
//
// A workload mount of a copy may have a sub_path (the kubelet's subPath): the kubelet
// makes that directory when it creates the container, so the copy is filled only once
// every container mounting a sub_path of it answers, into the kubelet's directories in
// place, and an archive with a file or symlink there is refused (snapshot.go subPaths).
// The filler always mounts the whole copy, so a writer's commit is the whole volume.
//
// The filler is not a container of the spec: DialAgent (the runner's exec, files,
// logs) refuses its name; only the backend's restore reaches it. A spec container
// called containerFiller is refused when the spec has a volume to fill or commit
// through the filler (checkFiller).
//
// A writer (a copy with Global.CommitGeneration > 0, the gateway's write lease) is
// committed as on the local backend: the runner archives the copy after the workload
// stopped and before the Pod is deleted (runner commitGlobals), through the filler, which
// then stays: its agent is never started (held in standby until the Pod goes), the
// gate is kept up for it (`serve --hold`: after the primary's agent has ended, until
// the filler's agent has), and such a Pod always has one, also for an empty volume. The
// workload ends without the Pod: the sandbox ends once every workload container has
// terminated (workloadEnded; the primary's agent leaves its final status in its own
// termination message, since the gate outlives it), and Stop ends the workload through
// the agents (AgentService.Stop: SIGTERM, SIGKILL after the grace) instead of deleting
// the Pod. CaptureVolume then reads the copy through the filler (ArchivePath), which
// DialAgent allows until the Pod is deleted; Destroy deletes the Pod. A workload that
// does not stop (its agent unreachable, or an older agent without Stop) gets the Pod
// deleted after the grace and a margin, as before: that session's writes are lost.

const (
	// containerFiller is the Pod container (and gate server name) of the filler: a name
	// the public spec reserves (spec.ReservedContainerName: the object-store agent's
	// restore containers), so the API refuses a caller's container so named; checkFiller
	// is the backstop for a spec that comes another way.
	containerFiller = "cw-object-store-agent-volumes"
	// fillerDir is where the filler mounts the GLOBAL copies: fillerDir/<volume index>.
	fillerDir = "/sandbox-volumes"
	// fillerConfigKey is the Secret key of the filler's agent config.
	fillerConfigKey = "config-" + containerFiller + ".json"
	// fillerVolRun, fillerVolConfig are the filler's own Pod volumes.
	fillerVolRun    = "filler-run"
	fillerVolConfig = "filler-config"
)

// filled reports whether spec's volume i is restored through the filler: a GLOBAL copy
// restored from its generation, or a scratch volume restored from a snapshot that a
// container mounts but that no workload agent can fill alone (snapshot.go fillsInPlace).
func filled(spec *runtime.Spec, i int) bool {
	v := &spec.Volumes[i]
	return v.RestoreDigest != "" && (v.Global != nil || !fillsInPlace(spec, v.Name))
}

// committed reports whether volume v is a GLOBAL writer's copy, archived through the
// filler when the workload has stopped.
func committed(v *runtime.Volume) bool { return v.Global != nil && v.Global.CommitGeneration > 0 }

// viaFiller reports whether the filler mounts spec's volume i.
func viaFiller(spec *runtime.Spec, i int) bool { return filled(spec, i) || committed(&spec.Volumes[i]) }

// capturedViaFiller reports whether spec's volume i is a scratch volume the filler fills
// (filled) that no workload container mounts at its root (sub_path mounts only): only
// the filler, which mounts its root, can archive it, so the filler stays for its
// captures (keepsFillerForCaptures) and CaptureVolume goes through it.
func capturedViaFiller(spec *runtime.Spec, i int) bool {
	v := &spec.Volumes[i]
	if v.Global != nil || !filled(spec, i) {
		return false
	}
	_, _, err := volumeMount(spec, v.Name, false)
	return err != nil
}

// capturedIndex is the index of spec's scratch volume called volume when it is captured
// through the filler (capturedViaFiller), -1 otherwise.
func capturedIndex(spec *runtime.Spec, volume string) int {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == volume && capturedViaFiller(spec, i) {
			return i
		}
	}
	return -1
}

// keepsFillerForCaptures reports whether spec's filler stays, held in standby, once the
// volumes are filled, for the captures of a scratch volume mounted by sub_path only
// (capturedViaFiller) while the workload runs. Not a GLOBAL writer's (commits: its filler
// stays anyway, and its Pod outlives the workload for the commit): this Pod ends with its
// primary (primaryDone), and its filler with it.
func keepsFillerForCaptures(spec *runtime.Spec) bool {
	if commits(spec) {
		return false
	}
	for i := range spec.Volumes {
		if capturedViaFiller(spec, i) {
			return true
		}
	}
	return false
}

// needsFiller reports whether spec has a volume to fill or a GLOBAL copy to commit
// through the filler.
func needsFiller(spec *runtime.Spec) bool {
	for i := range spec.Volumes {
		if viaFiller(spec, i) {
			return true
		}
	}
	return false
}

// commits reports whether spec writes a GLOBAL volume: its Pod outlives its workload
// until the runner has archived the copy.
func commits(spec *runtime.Spec) bool {
	for i := range spec.Volumes {
		if committed(&spec.Volumes[i]) {
			return true
		}
	}
	return false
}

// globalIndex is the index of spec's GLOBAL writer copy called volume, -1 if none.
func globalIndex(spec *runtime.Spec, volume string) int {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == volume && committed(&spec.Volumes[i]) {
			return i
		}
	}
	return -1
}

// fillerPath is where the filler mounts spec volume i.
func fillerPath(i int) string { return fillerDir + "/" + strconv.Itoa(i) }

// checkFiller refuses a spec whose container name would take the filler's place.
func checkFiller(spec *runtime.Spec) error {
	if !needsFiller(spec) {
		return nil
	}
	for _, c := range spec.AllContainers() {
		if c.ContainerName() == containerFiller {
			return fillerNameErr()
		}
	}
	return nil
}

func fillerNameErr() error {
	return fmt.Errorf("%w: container name %q is reserved on Kubernetes in a sandbox mounting a GLOBAL volume or restoring a volume through the runner's filler", runtime.ErrInvalidSpec, containerFiller)
}

// fillerConfig is the filler agent's config (held in standby) and its identity.
func fillerConfig(id string) ([]byte, *agentconfig.Identity, error) {
	ident := agent.NewIdentity(id + "/" + containerFiller)
	b, err := json.Marshal(&agentconfig.Config{Standby: true, Hostname: runtime.Hostname(id), Identity: ident})
	return b, ident, err
}

// fillerCaps are the capabilities the filler's extraction needs (fsarchive): restore
// the archive's owners (CHOWN), write into directories whatever their modes
// (DAC_OVERRIDE), set modes and times of files it no longer owns (FOWNER). Nothing
// else: it runs no command as another user and signals nothing (an archive holds no
// setuid or setgid bits, so no FSETID).
var fillerCaps = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER"}

// fillerSecurityContext: root (the archive's owners are restored), no privilege
// escalation, fillerCaps only, a read-only root (the agent writes only to its run
// emptyDir and the copies).
func fillerSecurityContext() *corev1.SecurityContext {
	no, yes := false, true
	return &corev1.SecurityContext{
		RunAsUser:                ptr(int64(0)),
		RunAsGroup:               ptr(int64(0)),
		AllowPrivilegeEscalation: &no,
		ReadOnlyRootFilesystem:   &yes,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: slices.Clone(fillerCaps)},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// addFiller adds the filler to pod when spec has volumes to fill or a GLOBAL copy to
// commit through it (needsFiller: GLOBAL copies, restored scratch volumes no workload
// agent fills alone): its container (mounting each such volume's emptyDir, vol-<i>,
// writable), its run emptyDir (also mounted in the gate under gate.ContainersDir) and
// its config (the sandbox's Secret).
func (b *Backend) addFiller(pod *corev1.Pod, spec *runtime.Spec) {
	if !needsFiller(spec) {
		return
	}
	mounts := []corev1.VolumeMount{
		{Name: "bin", MountPath: gate.BinDir, ReadOnly: true},
		{Name: fillerVolRun, MountPath: gate.RunDir},
		{Name: fillerVolConfig, MountPath: gate.ConfigDir, ReadOnly: true},
	}
	for i := range spec.Volumes {
		if viaFiller(spec, i) {
			mounts = append(mounts, corev1.VolumeMount{Name: "vol-" + strconv.Itoa(i), MountPath: fillerPath(i)})
		}
	}
	// The filler's memory limit is its own (the agent's extraction), never a volume's: a
	// memory volume through the filler is refused (planRestores), since its pages would
	// be charged to the filler and lift the Pod's limit by a caller-chosen size.
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	if keepsFillerForCaptures(spec) {
		// Kept for the sandbox's life, its archive compression runs while the workload
		// does, and its CPU is not the sandbox's (helperContainer: left out of usage): a
		// limit of its own, one core or the sandbox's own limit when smaller.
		res.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(keptFillerMilliCPU(spec), resource.DecimalSI)
	}
	if copies := globalCopiesBytes(spec); copies > 0 && podLimitsEphemeral(pod) {
		// The kubelet evicts a Pod whose ephemeral storage (its containers' writable
		// layers and logs, and its disk emptyDirs, the copies included) exceeds the sum
		// of its containers' limits, which is otherwise the primary's disk alone: the
		// GLOBAL copies' sizes (bounded by the volume's policy) go on the filler's limit
		// (a cap, not a reservation: request 0), so a full copy never gets the Pod
		// evicted and the primary keeps its own bound. A restored scratch volume's size
		// (the caller's choice) does not: it stays within the Pod's own disk, as when a
		// workload agent fills it.
		res.Limits[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(copies, resource.BinarySI)
		res.Requests[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(0, resource.BinarySI)
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: fillerVolRun, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: fillerVolConfig, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: secretName(spec.ID), DefaultMode: ptr(int32(0o444)),
			Items: []corev1.KeyToPath{{Key: fillerConfigKey, Path: gate.ConfigFile}},
		}}},
	)
	writer := commits(spec)
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		switch {
		case c.Name == containerGate:
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: fillerVolRun, MountPath: gate.ContainersDir + "/" + containerFiller})
			if writer {
				// Up for the filler until the runner has archived the copy through it.
				c.Command = append(c.Command, gate.FlagHold, containerFiller)
			}
		case c.Name == containerMain && writer && !slices.Contains(c.Command, gate.FlagTerminationLog):
			// The gate outlives the primary's agent: its final status goes into its
			// own termination message (exitOf reads it there).
			c.Command = append(c.Command, gate.FlagTerminationLog)
		}
	}
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
		Name: containerFiller, Image: b.cfg.AgentImage, ImagePullPolicy: b.cfg.ImagePullPolicy,
		Command:                  []string{gate.GatePath, "exec-agent"},
		VolumeMounts:             mounts,
		Resources:                res,
		SecurityContext:          fillerSecurityContext(),
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	})
}

// maxKeptFillerMilliCPU is the CPU limit of a filler kept for captures
// (keepsFillerForCaptures) in a sandbox without a CPU limit, or with a larger one.
const maxKeptFillerMilliCPU = 1000

// keptFillerMilliCPU is the CPU limit of spec's filler kept for captures: the
// sandbox's own (all its containers', TotalResources) when below maxKeptFillerMilliCPU,
// else that; at least the filler's 10m request.
func keptFillerMilliCPU(spec *runtime.Spec) int64 {
	m := int64(maxKeptFillerMilliCPU)
	if own := spec.TotalResources().MilliCPU; own > 0 {
		m = min(m, own)
	}
	return max(m, 10)
}

// maxFillerCopiesBytes bounds the GLOBAL copies' sizes the filler's ephemeral-storage
// limit takes (globalCopiesBytes): far above any sane policy, far below int64's range.
const maxFillerCopiesBytes = 1 << 46 // 64 TiB

// addBytes is a + b, saturating at math.MaxInt64 (sizes are caller input, each up to
// 2^62; negative ones count as 0).
func addBytes(a, b int64) int64 {
	a, b = max(a, 0), max(b, 0)
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// globalCopiesBytes is the saturating sum of the sizes of spec's GLOBAL copies the
// filler mounts: what its ephemeral-storage limit takes (planRestores refuses a sum
// above maxFillerCopiesBytes).
func globalCopiesBytes(spec *runtime.Spec) int64 {
	var n int64
	for i := range spec.Volumes {
		if spec.Volumes[i].Global != nil && viaFiller(spec, i) {
			n = addBytes(n, spec.Volumes[i].SizeBytes)
		}
	}
	return n
}

// podLimitsEphemeral reports whether a container of pod has an ephemeral-storage limit
// (the primary, given a disk size): only then does the Pod have one (with none, the
// filler's alone would bound the whole Pod by the copies' sizes).
func podLimitsEphemeral(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		if _, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]; ok {
			return true
		}
	}
	return false
}

// fillerNoop is the filler agent's Start config once the copies are filled: it runs
// `sandbox-gate noop`, which exits 0, and the agent and its container end with it.
var fillerNoop = func() []byte {
	b, _ := json.Marshal(&agentconfig.Config{Argv: []string{gate.GatePath, "noop"}})
	return b
}()

// endFiller lets the filler end once the copies are filled (before any workload
// container starts; its Start accepted, the filler runs nothing more, though it may
// not have terminated yet).
func (b *Backend) endFiller(ctx context.Context, s *sandbox) error {
	if !needsFiller(&s.spec) || commits(&s.spec) || keepsFillerForCaptures(&s.spec) {
		// A writer's filler stays for the commit, and one of a volume mounted by sub_path
		// only for its captures.
		return nil
	}
	if _, err := b.agentClient(s.id, containerFiller).Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: fillerNoop})); err != nil {
		return fmt.Errorf("end the volume filler: %w", err)
	}
	return nil
}

// helperContainer reports whether a Pod container is the runner's own (the gate, the
// install init container, the GLOBAL volume filler), not one running the sandbox's
// images: left out of its usage, counted pulls and container reports.
func helperContainer(name string) bool {
	return name == containerGate || name == containerInstall || name == containerFiller
}

// workloadPodNames are the Pod containers of spec's workload that run to the end (the
// primary and the sidecars; not the init containers, which have run before).
func workloadPodNames(spec *runtime.Spec) []string {
	if !spec.Multi() {
		return []string{containerMain}
	}
	var out []string
	for _, m := range members(spec) {
		if !m.init {
			out = append(out, m.pod)
		}
	}
	return out
}

// workloadEnded reports whether every workload container of a GLOBAL writer's Pod has
// terminated (the Pod runs on with the gate and the filler until the runner has archived
// the copy). A gate that terminated first does not end the sandbox (gateEnded).
func workloadEnded(p *corev1.Pod, spec *runtime.Spec) bool {
	for _, name := range workloadPodNames(spec) {
		cs := podContainerStatus(statusesOf(p), name)
		if cs == nil || cs.State.Terminated == nil {
			return false
		}
	}
	return p != nil
}

// gateEnded reports whether p's gate has terminated.
func gateEnded(p *corev1.Pod) bool {
	cs := podContainerStatus(statusesOf(p), containerGate)
	return cs != nil && cs.State.Terminated != nil
}

// workloadRuns reports whether any workload container of p (the primary, a sidecar)
// has not terminated.
func workloadRuns(p *corev1.Pod, spec *runtime.Spec) bool {
	for _, name := range workloadPodNames(spec) {
		if cs := podContainerStatus(statusesOf(p), name); cs == nil || cs.State.Terminated == nil {
			return true
		}
	}
	return false
}

// workloadRunning reports whether any workload container of p runs.
func workloadRunning(p *corev1.Pod, spec *runtime.Spec) bool {
	for _, name := range workloadPodNames(spec) {
		if cs := podContainerStatus(statusesOf(p), name); cs != nil && cs.State.Running != nil {
			return true
		}
	}
	return false
}

// annotationWorkloadStarted is set ("true") on a GLOBAL writer's Pod just before its
// workload is started (after the fill, once the filler answers): captureGlobal commits
// only the copy of a Pod so marked, also after a runner restart. Set before the Start,
// a restart between the two finds the agent still in standby (Recover: neverStarted).
// Under runtime.ReservedPodAnnotationPrefix: a policy cannot set it.
const annotationWorkloadStarted = runtime.ReservedPodAnnotationPrefix + "workload-started"

// markStarted sets annotationWorkloadStarted on a writer's Pod (its in-memory copy too).
func (b *Backend) markStarted(ctx context.Context, s *sandbox) error {
	if !commits(&s.spec) {
		return nil
	}
	patch := []byte(`{"metadata":{"annotations":{"` + annotationWorkloadStarted + `":"true"}}}`)
	p, err := b.cfg.Client.CoreV1().Pods(b.cfg.Namespace).Patch(ctx, podName(s.id), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("mark the GLOBAL writer's workload started: %w", err)
	}
	b.mu.Lock()
	if s.pod == nil || s.pod.UID == p.UID {
		cp := s.pod.DeepCopy()
		if cp == nil {
			cp = p
		}
		if cp.Annotations == nil {
			cp.Annotations = map[string]string{}
		}
		cp.Annotations[annotationWorkloadStarted] = "true"
		s.pod = cp
	}
	b.mu.Unlock()
	return nil
}

// stopWorkload ends the workload of a GLOBAL writer's Pod without deleting the Pod: each
// named workload container (runtime names, "" the primary) gets its agent's Stop
// (SIGTERM to its main command, SIGKILL after grace), which ends the agent and the
// container. stopped is false when that did not end the whole workload within grace and
// ForceDeleteAfter (an agent unreachable, or one older than Stop): the caller then
// deletes the Pod, as for any other Pod, and the copy goes with it uncommitted.
func (b *Backend) stopWorkload(ctx context.Context, s *sandbox, names []string, grace time.Duration) (stopped bool, err error) {
	secs := max(int64((grace+time.Second-1)/time.Second), 1)
	var failed []string
	for _, name := range names {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := b.agentClient(s.id, name).Stop(cctx, connect.NewRequest(&agentv1.StopRequest{Grace: durationpb.New(time.Duration(secs) * time.Second)}))
		cancel()
		if err != nil {
			failed = append(failed, fmt.Sprintf("%q: %v", name, err))
		}
	}
	if len(failed) > 0 {
		b.log.Warn("a GLOBAL volume writer's workload could not be stopped through its agents: deleting its Pod; the volume's writes of this session are lost",
			"sandbox", s.id, "failed", failed)
		return false, nil
	}
	timer := time.NewTimer(time.Duration(secs)*time.Second + b.cfg.ForceDeleteAfter)
	defer timer.Stop()
	for {
		b.mu.Lock()
		ended := s.deleted || podEnded(s.pod) || workloadEnded(s.pod, &s.spec)
		changed := s.changed
		b.mu.Unlock()
		if ended {
			return true, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			b.log.Warn("a GLOBAL volume writer's workload did not stop: deleting its Pod; the volume's writes of this session are lost", "sandbox", s.id)
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// runningWorkload are the runtime container names (for agentClient) of spec's workload
// containers that have not terminated in p.
func runningWorkload(p *corev1.Pod, spec *runtime.Spec) []string {
	var out []string
	if !spec.Multi() {
		if cs := podContainerStatus(statusesOf(p), containerMain); cs == nil || cs.State.Terminated == nil {
			out = append(out, "")
		}
		return out
	}
	for _, m := range members(spec) {
		if m.init {
			continue
		}
		if cs := podContainerStatus(statusesOf(p), m.pod); cs != nil && cs.State.Terminated != nil {
			continue
		}
		if m.primary {
			out = append(out, "")
		} else {
			out = append(out, m.name)
		}
	}
	return out
}
