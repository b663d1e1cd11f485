package kubernetes

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
)

func (b *Backend) runtimeClass(class string) (string, string, error) {
	if class == "" {
		class = b.cfg.DefaultRuntimeClass
	}
	if b.cfg.RuntimeClasses == nil {
		if class == "runc" {
			return class, "", nil
		}
		return class, class, nil
	}
	name, ok := b.cfg.RuntimeClasses[class]
	if !ok {
		return class, "", fmt.Errorf("%w %q", runtime.ErrUnknownRuntime, class)
	}
	return class, name, nil
}

// Create implements runtime.Backend: a Secret (agent config, keys, spec), the Pod, then
// it waits until the Pod runs and its agent answers through the gate.
func (b *Backend) Create(ctx context.Context, spec *runtime.Spec) (_ runtime.Info, err error) {
	if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
		return runtime.Info{}, err
	}
	if spec.Engine != nil {
		return runtime.Info{}, fmt.Errorf("%w by the kubernetes backend yet", runtime.ErrEngineUnsupported)
	}
	// Warm pool (pool.go): other Creates hold refills back; a reserved warm Pod is claimed.
	defer b.enterCreate(ctx)()
	if info, claimed, err := b.claimWarm(ctx, spec); claimed {
		return info, err
	}
	warm := warmLabel(ctx) // a refill's Create: the agent waits in standby, unclaimed
	for _, c := range spec.AllContainers() {
		if len(c.SecretEnv) > 0 {
			// A Pod's env is stored by the API server: secrets from the built-in store
			// would land there. A KUBERNETES store's (SecretRefs) are taken by reference.
			return runtime.Info{}, fmt.Errorf("container %q: %w: secrets from the built-in secret store on the kubernetes backend (use a KUBERNETES store)", c.ContainerName(), errdefs.ErrNotImplemented)
		}
	}
	if err := b.checkEgress(spec); err != nil {
		return runtime.Info{}, err
	}
	// Egress secrets (egress.go): the CA and the values stay in this process; the
	// placeholders reach the containers only through their agents' Start.
	egressSecrets, placeholders, err := prepareEgressSecrets(spec)
	if err != nil {
		return runtime.Info{}, err
	}
	// A working directory the image sets below a restored volume's mount: the fill must
	// know it (snapshot.go imageWorkDirs), so Create, its Pod and the persisted spec use
	// it as the spec's.
	spec = b.imageWorkDirs(ctx, spec)
	// Checked before anything is made: a Secret that does not grant the organization's
	// store refuses the spec.
	if err := b.CheckSecretRefs(ctx, spec); err != nil {
		return runtime.Info{}, err
	}
	claims, single, err := b.resolveClaims(ctx, spec)
	if err != nil {
		return runtime.Info{}, err
	}
	// A ReadWriteOnce claim already mounted: this Pod goes to the same node.
	claimNode, err := b.claimNode(ctx, spec.ID, single)
	if err != nil {
		return runtime.Info{}, err
	}
	if err := checkFiller(spec); err != nil {
		return runtime.Info{}, err
	}
	for _, v := range spec.Volumes {
		if v.Keep != "" {
			return runtime.Info{}, fmt.Errorf("volume %q: %w: the kubernetes backend keeps no volumes past their sandbox", v.Name, errdefs.ErrNotImplemented)
		}
	}
	class, rcName, err := b.runtimeClass(spec.RuntimeClass)
	if err != nil {
		return runtime.Info{}, err
	}
	var (
		grp   *group
		sc    *corev1.SecurityContext
		runAs string
		argv  []string
	)
	if spec.Multi() {
		if grp, err = b.prepareGroup(ctx, spec, placeholders); err != nil {
			return runtime.Info{}, err
		}
	} else {
		imageUser := ""
		if imageUserNeeded(spec.Security) {
			ic, err := b.cfg.ImageConfig(ctx, spec.Image, spec.PullCredentials)
			if err != nil {
				return runtime.Info{}, errImageUser(spec.Image, err)
			}
			imageUser = ic.User
		}
		sc, runAs = securityFor(spec.Security, imageUser)
		if argv, err = b.argv(ctx, spec); err != nil {
			return runtime.Info{}, err
		}
	}
	// LabelWarm goes on the Pod and its Secret only (what Recover reads): the
	// NetworkPolicy and the pull Secret keep the sandbox's labels once it is claimed,
	// so a cleanup by that label never strips a live sandbox's policy.
	base := b.labels(spec)
	lbls := maps.Clone(base)
	if warm != "" {
		lbls[LabelWarm] = warm
	}
	// Translated before anything is made: a rule NetworkPolicy cannot express refuses
	// the spec.
	np, err := b.networkPolicyFor(spec, base)
	if err != nil {
		return runtime.Info{}, err
	}
	// Restored volumes are checked before anything is made; their archives stay cached
	// until the Create is done.
	plan, release, err := b.planRestores(spec)
	if err != nil {
		return runtime.Info{}, err
	}
	defer release()
	persisted := *spec
	persisted.PullCredentials, persisted.EgressSecretValues = nil, nil
	persisted.RuntimeClass = class

	client, clientPEM, clientKeyPEM, err := selfSigned("sandboxd-runner")
	if err != nil {
		return runtime.Info{}, err
	}
	server, serverPEM, serverKeyPEM, err := selfSigned("sandbox-" + spec.ID)
	if err != nil {
		return runtime.Info{}, err
	}
	s := &sandbox{
		id: spec.ID, spec: persisted, class: class, client: client, server: server.Certificate[0],
		changed: make(chan struct{}), done: make(chan struct{}), egress: egressSecrets,
	}
	if b.hello != nil && !spec.Multi() {
		// Groups: the gate's primary socket lies elsewhere; they wait for the kubelet.
		if s.helloKey, err = newHelloKey(); err != nil {
			return runtime.Info{}, err
		}
	}
	if grp != nil {
		s.group, s.idents = grp, grp.idents
	}
	b.mu.Lock()
	if b.sandboxes[spec.ID] != nil {
		b.mu.Unlock()
		return runtime.Info{}, fmt.Errorf("%w: sandbox %s already exists", runtime.ErrInvalidSpec, spec.ID)
	}
	b.sandboxes[spec.ID] = s
	b.mu.Unlock()
	// What this Create made: a failed Create undoes only that. A duplicate ID (the
	// sandbox's Secret exists: another sandbox's, maybe of another runner) leaves the
	// existing sandbox's objects alone.
	var made createMade
	defer func() {
		if err != nil {
			if derr := b.undoCreate(context.WithoutCancel(ctx), spec.ID, &made); derr != nil {
				b.log.Warn("undo failed create", "sandbox", spec.ID, "err", derr)
			}
			b.mu.Lock()
			if b.sandboxes[spec.ID] == s {
				delete(b.sandboxes, spec.ID)
			}
			b.mu.Unlock()
		}
	}()

	specJSON, err := json.Marshal(&persisted)
	if err != nil {
		return runtime.Info{}, err
	}
	data := map[string][]byte{
		secretSpec:          specJSON,
		gate.TLSCertFile:    serverPEM,
		gate.TLSKeyFile:     serverKeyPEM,
		gate.ClientCertFile: clientPEM,
		secretClientKey:     clientKeyPEM,
	}
	if s.helloKey != nil {
		data[gate.HelloKeyFile] = s.helloKey
	}
	if egressSecrets != nil {
		data[gate.EgressCAFile] = egressSecrets.CACertPEM() // the certificate only: public
	}
	if needsFiller(spec) {
		// The volume filler's agent (globalvol.go): GLOBAL copies, restored scratch volumes.
		cfg, ident, err := fillerConfig(spec.ID)
		if err != nil {
			return runtime.Info{}, err
		}
		data[fillerConfigKey] = cfg
		if s.idents == nil {
			s.idents = map[string]*agentconfig.Identity{}
		}
		s.idents[containerFiller] = ident
	}
	var startCfg []byte // the main command's config, when held for restores
	if grp != nil {
		maps.Copy(data, grp.secret)
		s.ident = grp.idents[spec.ContainerName()]
	} else {
		acfg := agentconfig.Config{
			Argv:         argv,
			Env:          egressStartEnv(&spec.Container, placeholders),
			WorkingDir:   spec.WorkingDir,
			RestartLimit: spec.RestartLimit,
			Hostname:     runtime.Hostname(spec.ID),
			User:         runAs,
			Identity:     agent.NewIdentity(spec.ID),
			// KUBERNETES-store secrets: the kubelet sets them; only names in files.
			EnvFromProcess: secretRefNames(&spec.Container),
		}
		s.ident = acfg.Identity
		for _, f := range spec.Files {
			acfg.Files = append(acfg.Files, agentconfig.File{Path: f.Path, Content: f.Content, Mode: f.Mode})
		}
		inPod := acfg
		if holdInStandby(spec, plan) || warm != "" || b.usesEgress(spec) || len(spec.Network.EgressSecrets()) > 0 {
			// Held in standby until the restored volumes are filled (snapshot.go), and a
			// GLOBAL writer's until its filler's agent answers (also on an empty volume):
			// the gate's hold and the commit go through that agent. With host-name
			// rules, until the Pod's address is in the egress registry (egress.go): the
			// kubelet reports it up to a relist after the containers start, and the
			// runner's DNS refuses an address it does not know. With egress secrets
			// always (besides): their placeholders are in the Start config only, never
			// in the Secret's config.json.
			start := acfg
			start.Identity = nil
			if startCfg, err = json.Marshal(&start); err != nil {
				return runtime.Info{}, err
			}
			inPod = agentconfig.Config{Standby: true, Hostname: acfg.Hostname, Identity: acfg.Identity, EnvFromProcess: acfg.EnvFromProcess}
		}
		cfgJSON, err := json.Marshal(&inPod)
		if err != nil {
			return runtime.Info{}, err
		}
		data[gate.ConfigFile] = cfgJSON
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName(spec.ID), Namespace: b.cfg.Namespace, Labels: lbls},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
	// The organization's platform registry token goes into its Secret (orgsecret.go),
	// any other credentials into the sandbox's own.
	orgPull, rest := b.splitPullCreds(spec)
	ps, err := dockerConfigSecret(rest)
	if err != nil {
		return runtime.Info{}, err
	}
	// The sandbox's Secret, the pull Secrets and the NetworkPolicy do not depend on each
	// other: written at once, all before the Pod (so the Pod never runs unconfined).
	secrets := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace)
	var (
		writes  errgroup.Group
		secErr  error
		secDone = make(chan struct{})
		orgName string
		ownPull string
	)
	writes.Go(func() error {
		defer close(secDone)
		secErr = b.createSandboxSecret(ctx, spec.ID, sec)
		made.secret = secErr == nil
		return secErr
	})
	if orgPull != nil {
		writes.Go(func() error {
			n, err := b.ensureOrgSecret(ctx, orgPull)
			if err != nil {
				return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
			}
			orgName = n
			return nil
		})
	}
	if ps != nil {
		ps.Namespace, ps.Labels = b.cfg.Namespace, maps.Clone(base)
		ownPull = ps.Name
		writes.Go(func() error {
			if _, err := secrets.Create(ctx, ps, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create sandbox %s: pull secret: %w", spec.ID, err)
			}
			made.pull = true
			return nil
		})
	}
	if np != nil {
		writes.Go(func() error {
			// A plain create: an existing policy of that name is replaced only once this
			// Create holds the ID (its sandbox Secret was made): a leftover of a create
			// that died before its Pod, never a live sandbox's policy.
			_, err := b.cfg.Client.NetworkingV1().NetworkPolicies(b.cfg.Namespace).Create(ctx, np, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				<-secDone
				if secErr != nil {
					return secErr
				}
				err = b.createNetworkPolicy(ctx, np)
			} else if apierrors.IsInvalid(err) {
				err = fmt.Errorf("%w: network policy: %w", runtime.ErrInvalidSpec, err)
			}
			if err != nil {
				return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
			}
			made.policy = true
			return nil
		})
	}
	if err := writes.Wait(); err != nil {
		if secErr != nil {
			// The sandbox's own Secret's error says most (an existing sandbox, a spec
			// too large), whichever write failed first.
			err = secErr
		}
		return runtime.Info{}, err
	}
	var pullSecrets []string
	if orgName != "" {
		pullSecrets = append(pullSecrets, orgName)
	}
	if ownPull != "" {
		pullSecrets = append(pullSecrets, ownPull)
	}
	pod := b.buildPod(s, spec, podParts{grp: grp, class: class, rcName: rcName, labels: lbls, pullSecrets: pullSecrets, sc: sc, claims: claims, node: claimNode})
	b.mu.Lock()
	s.steps = &createSteps{}
	b.mu.Unlock()
	created, err := b.cfg.Client.CoreV1().Pods(b.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	// Any outcome but "exists" may have made it (a timeout after the write).
	made.pod = err == nil || !apierrors.IsAlreadyExists(err)
	if err != nil {
		switch {
		case apierrors.IsAlreadyExists(err):
			return runtime.Info{}, fmt.Errorf("%w: sandbox %s already exists", runtime.ErrInvalidSpec, spec.ID)
		case rcName != "" && strings.Contains(err.Error(), "RuntimeClass"):
			return runtime.Info{}, fmt.Errorf("%w %q: %w", runtime.ErrUnknownRuntime, class, err)
		case apierrors.IsInvalid(err):
			return runtime.Info{}, fmt.Errorf("%w: %w", runtime.ErrInvalidSpec, err)
		}
		return runtime.Info{}, fmt.Errorf("create sandbox %s: pod: %w", spec.ID, err)
	}
	b.mu.Lock()
	s.uid = created.UID
	s.steps.created = time.Now()
	if s.pod == nil || s.pod.UID != created.UID {
		s.pod = created
	}
	s.steps.observe(s.pod, s.steps.created)
	b.hookLocked(s, StepCreated, s.steps.created)
	b.hookPodLocked(s, s.steps.created)
	adopted := make(chan struct{})
	s.adopted = adopted
	b.mu.Unlock()
	// The steps and image pulls it saw, whatever the outcome (observe.go).
	defer b.reportCreate(ctx, s, created, &err)
	// The Secrets go with the Pod (garbage collector), also when the runner is gone.
	go func() {
		defer close(adopted)
		b.adoptSecrets(context.WithoutCancel(ctx), created, ownPull, np != nil)
	}()

	if grp != nil {
		b.watchAgents(s)
		// The held containers start once the restored volumes are filled.
		if err := b.runRestores(ctx, s, plan); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := b.markStarted(ctx, s); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := b.waitEgress(ctx, s); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		// The containers wait held; they start in the spec's order (init containers:
		// the kubelet's, in order). A *startseq.Failure names the container.
		if err := startseq.Run(ctx, spec, groupOps{b: b, s: s}); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, groupStartError(err, b.podStartError(s), spec))
		}
	}
	info, err := b.waitRunning(ctx, s)
	if err != nil {
		return runtime.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if warm != "" {
		return info, nil // a warm Pod: its claim starts the main command (pool.go)
	}
	if startCfg != nil {
		// The agent answers in standby: fill the volumes, then start the main command.
		if err := b.runRestores(ctx, s, plan); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := b.markStarted(ctx, s); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := b.waitEgress(ctx, s); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if _, err := b.agentClient(s.id, "").Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: startCfg})); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: start the main command after the restore: %w", spec.ID, err)
		}
		info = b.info(s)
	}
	if p := spec.StartupProbe; grp == nil && p != nil {
		// As in a group (startseq.Run): Create returns, and the sandbox runs, once the
		// probe has passed in the one container; a *startseq.Failure names it.
		if err := startseq.Probe(ctx, primaryOps{groupOps{b: b, s: s}}, spec.ContainerName(), p); err != nil {
			return runtime.Info{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	b.startLogs(s)
	return info, nil
}

// podStartError is startError of s's Pod as the watch last showed it.
func (b *Backend) podStartError(s *sandbox) error {
	b.mu.Lock()
	pod := s.pod
	b.mu.Unlock()
	return startError(pod, &s.spec)
}

// groupStartError is how a group's failed start sequence (err) is reported when a
// container of the Pod cannot start (serr, from startError): a *startseq.Failure is
// always the spec's StartError, which is right for a workload container the runtime
// could not create (serr is runtime.ErrInvalidSpec), but an image that cannot be pulled
// is ImagePullFailed and the runner's own container's failure is BackendError, as
// for a single-container sandbox. The failing container's name is kept.
//
// Only the sequence's StartError of the very container serr concerns is swapped (or
// any container's when serr is the runner's own container's: the gate, which every
// agent is reached through, the install or the filler, without which none starts); an
// init container that exited non-zero, a failed startup probe or a dependency, and
// another container's failure keep the sequence's reason.
func groupStartError(err, serr error, spec *runtime.Spec) error {
	var f *startseq.Failure
	var cf *containerFailure
	if serr == nil || errors.Is(serr, runtime.ErrInvalidSpec) || !errors.As(err, &f) ||
		f.Reason != startseq.ReasonStartError || !errors.As(serr, &cf) {
		return err
	}
	if !helperContainer(cf.Pod) && cf.Pod != memberPodName(spec, f.Container) {
		return err
	}
	return fmt.Errorf("container %q: %w", f.Container, serr)
}

// memberPodName is the Pod container name of spec's container name ("" none).
func memberPodName(spec *runtime.Spec, name string) string {
	if spec == nil {
		return ""
	}
	if !spec.Multi() {
		if name == spec.ContainerName() {
			return containerMain
		}
		return ""
	}
	for _, m := range members(spec) {
		if m.name == name {
			return m.pod
		}
	}
	return ""
}

// podParts is what buildPod makes a sandbox's Pod of besides its spec: what Create
// resolved (the group, the runtime class, labels, pull Secrets, the main container's
// security context, claims and a node to pin to).
type podParts struct {
	grp         *group
	class       string
	rcName      string
	labels      map[string]string
	pullSecrets []string
	sc          *corev1.SecurityContext
	claims      map[int]string
	node        string
}

// buildPod is the Pod of sandbox s (spec): Create's, and Resume's (checkpoint.go), which
// must give a restored gVisor sandbox the same containers, mounts and env.
func (b *Backend) buildPod(s *sandbox, spec *runtime.Spec, p podParts) *corev1.Pod {
	var pod *corev1.Pod
	if p.grp != nil {
		pod = b.podForGroup(spec, p.grp, p.rcName, p.labels, p.pullSecrets)
	} else {
		pod = b.podFor(spec, p.rcName, p.labels, p.pullSecrets, p.sc)
	}
	// The bin dir in the sentry's memory only where a pause can use it (it costs memory).
	addGVisorHints(pod, p.class, p.class == GVisorClass && b.cfg.NodeAgents != nil && pauseRefusal(spec, nil) == "")
	b.applyEgressPod(pod, spec)
	applyEgressSecretsPod(pod, spec, b.cfg.RunnerID)
	b.addHello(pod, s)
	b.addFiller(pod, spec)
	applyClaims(pod, p.claims)
	pinToNode(pod, p.node)
	applySecretRefs(pod, spec)
	return pod
}

// createMade records which objects a Create made.
type createMade struct{ secret, pull, policy, pod bool }

// undoCreate undoes a failed Create: Destroy once it may have made the Pod (under its
// UID once known), else the deletion of exactly the objects it made.
func (b *Backend) undoCreate(ctx context.Context, id string, m *createMade) error {
	if m.pod {
		return b.Destroy(ctx, id)
	}
	var errs []error
	secrets := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace)
	for _, o := range []struct {
		made bool
		del  func() error
	}{
		{m.secret, func() error { return secrets.Delete(ctx, secretName(id), metav1.DeleteOptions{}) }},
		{m.pull, func() error { return secrets.Delete(ctx, pullSecretName(id), metav1.DeleteOptions{}) }},
		{m.policy, func() error {
			return b.cfg.Client.NetworkingV1().NetworkPolicies(b.cfg.Namespace).Delete(ctx, networkPolicyName(id), metav1.DeleteOptions{})
		}},
	} {
		if !o.made {
			continue
		}
		if err := o.del(); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// createSandboxSecret creates the sandbox's own Secret (agent config, keys, spec).
func (b *Backend) createSandboxSecret(ctx context.Context, id string, sec *corev1.Secret) error {
	_, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Create(ctx, sec, metav1.CreateOptions{})
	switch {
	case err == nil:
		return nil
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%w: sandbox %s already exists", runtime.ErrInvalidSpec, id)
	case apierrors.IsInvalid(err), apierrors.IsRequestEntityTooLargeError(err), strings.Contains(err.Error(), "too large"):
		// Env and files travel in the Secret: at most 1 MiB together.
		return fmt.Errorf("%w: env and files too large for a Secret: %w", runtime.ErrInvalidSpec, err)
	}
	return fmt.Errorf("create sandbox %s: secret: %w", id, err)
}

// addHello makes pod's gate send its hello (hello.go): where to, the sandbox's ID, and
// its hello key in the gate's own Secret volume (the main container never mounts it).
func (b *Backend) addHello(pod *corev1.Pod, s *sandbox) {
	if s.helloKey == nil {
		return
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Name != containerGate {
			continue
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: gate.HelloAddrEnv, Value: b.cfg.HelloAddr}, corev1.EnvVar{Name: gate.HelloIDEnv, Value: s.id})
	}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if v.Name == "tls" && v.Secret != nil {
			v.Secret.Items = append(v.Secret.Items, corev1.KeyToPath{Key: gate.HelloKeyFile, Path: gate.HelloKeyFile})
		}
	}
}

// primaryOps probes a single-container sandbox: its one agent is the primary's ("").
type primaryOps struct{ groupOps }

func (o primaryOps) Exec(ctx context.Context, _ string, argv []string, timeout time.Duration) (int, error) {
	return o.groupOps.Exec(ctx, "", argv, timeout)
}

// adoptSecrets makes the Pod the owner of the sandbox's Secrets and NetworkPolicy.
func (b *Backend) adoptSecrets(ctx context.Context, pod *corev1.Pod, pull string, netpol bool) {
	id := pod.Labels[LabelSandbox]
	names := []string{secretName(id)}
	if pull != "" {
		names = append(names, pull)
	}
	patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q}]}}`, pod.Name, pod.UID)
	for _, n := range names {
		_, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Patch(ctx, n, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			b.log.Warn("set owner of sandbox secret", "secret", n, "err", err)
		}
	}
	if netpol {
		_, err := b.cfg.Client.NetworkingV1().NetworkPolicies(b.cfg.Namespace).Patch(ctx, networkPolicyName(id), "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			b.log.Warn("set owner of sandbox network policy", "sandbox", id, "err", err)
		}
	}
}

func (b *Backend) labels(spec *runtime.Spec) map[string]string {
	l := map[string]string{LabelManagedBy: ManagedBy, LabelSandbox: spec.ID, LabelRunner: b.cfg.RunnerID}
	if org := spec.Meta[runtime.MetaOrg]; org != "" && len(validation.IsValidLabelValue(org)) == 0 {
		l[LabelOrg] = org
	}
	if c := spec.Meta[runtime.MetaCaller]; c != "" {
		l[LabelUser] = userHash(c)
	}
	return l
}

// userHash is the LabelUser value of a caller: 48 hex digits of its SHA-256 (label
// values are at most 63 characters of a restricted alphabet; key IDs need not be).
func userHash(caller string) string {
	h := sha256.Sum256([]byte(caller))
	return hex.EncodeToString(h[:24])
}

// argv is the main command: [command]+args, or the image's entrypoint and cmd merged
// with the spec (ImageConfig).
func (b *Backend) argv(ctx context.Context, spec *runtime.Spec) ([]string, error) {
	if spec.Command != "" {
		return append([]string{spec.Command}, spec.Args...), nil
	}
	ic, err := b.cfg.ImageConfig(ctx, spec.Image, spec.PullCredentials)
	if err != nil {
		return nil, fmt.Errorf("image %s: entrypoint: %w", spec.Image, err)
	}
	argv, err := ic.Argv(spec.Command, spec.Args)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", runtime.ErrInvalidSpec, err)
	}
	return argv, nil
}

func (b *Backend) podFor(spec *runtime.Spec, rcName string, lbls map[string]string, pullSecrets []string, sc *corev1.SecurityContext) *corev1.Pod {
	grace := int64(b.cfg.TerminationGrace / time.Second)
	no := false
	mounts := func(ms ...corev1.VolumeMount) []corev1.VolumeMount { return ms }
	disk := spec.Resources.DiskBytes
	if disk == 0 {
		disk = b.cfg.DiskBytes
	}
	res := resourcesFor(spec.Resources, disk)
	helperRes := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(spec.ID), Namespace: b.cfg.Namespace, Labels: lbls},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever, // the agent restarts the main command
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			Hostname:                      runtime.Hostname(spec.ID),
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{
				{
					Name: containerGate, Image: b.cfg.AgentImage, ImagePullPolicy: b.cfg.ImagePullPolicy,
					Command: []string{"/sandbox-gate", "serve"},
					// The kubelet runs the hook before it starts the next container, in the
					// same sync: no init container to wait for (the kubelet notices a
					// container's end or start only at its next relist, ~1 s).
					Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{
						Exec: &corev1.ExecAction{Command: []string{"/sandbox-gate", "install"}},
					}},
					Ports: []corev1.ContainerPort{{Name: "agent", ContainerPort: gate.Port, Protocol: corev1.ProtocolTCP}},
					VolumeMounts: mounts(
						corev1.VolumeMount{Name: "bin", MountPath: gate.BinDir},
						corev1.VolumeMount{Name: "run", MountPath: gate.RunDir},
						corev1.VolumeMount{Name: "tls", MountPath: gate.TLSDir, ReadOnly: true},
					),
					Resources:                helperRes,
					SecurityContext:          gateSecurityContext(),
					TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				},
				{
					Name: containerMain, Image: spec.Image, ImagePullPolicy: b.pullPolicy(spec, &spec.Container),
					Command:         []string{gate.GatePath, "exec-agent"},
					WorkingDir:      spec.WorkingDir,
					Resources:       res,
					SecurityContext: sc,
					VolumeMounts: mounts(
						corev1.VolumeMount{Name: "bin", MountPath: gate.BinDir, ReadOnly: true},
						corev1.VolumeMount{Name: "run", MountPath: gate.RunDir},
						corev1.VolumeMount{Name: "config", MountPath: gate.ConfigDir, ReadOnly: true},
					),
				},
			},
			Volumes: []corev1.Volume{
				{Name: "bin", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "config", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
					SecretName: secretName(spec.ID), DefaultMode: ptr(int32(0o444)),
					Items: []corev1.KeyToPath{{Key: gate.ConfigFile, Path: gate.ConfigFile}},
				}}},
				// Readable by the gate's non-root user: only the gate mounts it, and an
				// fsGroup would change the main container's groups and volumes too.
				{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
					SecretName: secretName(spec.ID), DefaultMode: ptr(int32(0o444)),
					Items: []corev1.KeyToPath{
						{Key: gate.TLSCertFile, Path: gate.TLSCertFile},
						{Key: gate.TLSKeyFile, Path: gate.TLSKeyFile},
						{Key: gate.ClientCertFile, Path: gate.ClientCertFile},
					},
				}}},
			},
		},
	}
	vols, vmounts := volumesFor(spec)
	pod.Spec.Volumes = append(pod.Spec.Volumes, vols...)
	main := &pod.Spec.Containers[1]
	main.VolumeMounts = append(main.VolumeMounts, vmounts...)
	if rcName != "" {
		pod.Spec.RuntimeClassName = &rcName
	}
	for _, n := range pullSecrets {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: n})
	}
	applyPodSettings(pod, spec.Pod)
	return pod
}

// pullPolicy is the image pull policy of a sandbox container: Always when its image
// comes with pull credentials (a private image: every image of the platform registry, whose
// pull token the gateway adds, or one the caller brings credentials for), the configured
// policy otherwise. The kubelet runs an image its node already holds under IfNotPresent
// (and Never) without asking the registry — so a sandbox of another organization, naming
// by digest an image that one organization's sandbox pulled onto that node, would run it
// (Kubernetes checks pull Secrets against cached images only with the alpha feature
// KubeletEnsureSecretPulledImages, KEP-2535, not in v1.32). Under Always the kubelet
// resolves the reference at the registry with this Pod's pull Secret first: another
// organization's token is refused there (the registry answers NAME_UNKNOWN), and layers
// the node already has are not downloaded again. This is the Kubernetes counterpart of the
// local backend's private image cache (docs/api.md "A runner's image cache is not an
// access path").
// A container without credentials of its own whose image is in a registry that another
// container of the spec has credentials for is pulled with those too (the Pod's one pull
// Secret): Always as well.
func (b *Backend) pullPolicy(spec *runtime.Spec, c *runtime.Container) corev1.PullPolicy {
	if c.PullCredentials != nil {
		return corev1.PullAlways
	}
	reg := registryOf(c.Image)
	for _, o := range spec.AllContainers() {
		if o.PullCredentials != nil && reg != "" && registryOf(o.Image) == reg {
			return corev1.PullAlways
		}
	}
	return b.cfg.ImagePullPolicy
}

// registryOf is the registry host of image ("" when it does not parse).
func registryOf(image string) string {
	ref, err := name.ParseReference(image)
	if err != nil {
		return ""
	}
	return ref.Context().RegistryStr()
}

// applyPodSettings applies the policy's pod fragment. The service account changes the
// Pod's identity for the cluster (e.g. workload identity through its annotations); its
// token is still not mounted.
func applyPodSettings(pod *corev1.Pod, ps *runtime.PodSettings) {
	if ps == nil {
		return
	}
	if len(ps.NodeSelector) > 0 {
		pod.Spec.NodeSelector = maps.Clone(ps.NodeSelector)
	}
	for _, t := range ps.Tolerations {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{
			Key: t.Key, Operator: corev1.TolerationOperator(t.Operator), Value: t.Value,
			Effect: corev1.TaintEffect(t.Effect), TolerationSeconds: t.TolerationSeconds,
		})
	}
	pod.Spec.PriorityClassName = ps.PriorityClassName
	pod.Spec.ServiceAccountName = ps.ServiceAccountName
	for _, n := range ps.ImagePullSecrets {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: n})
	}
	if len(ps.Annotations) > 0 {
		pod.Annotations = maps.Clone(ps.Annotations)
		// The backend's own keys (policy validation refuses them; a policy stored before
		// may hold one): none forges a workload started or a warm claim.
		maps.DeleteFunc(pod.Annotations, func(k, _ string) bool {
			_, reserved := runtime.ReservedPodAnnotation(k)
			return reserved
		})
	}
}

func ptr[T any](v T) *T { return &v }

// waitRunning waits until the agent answers through the gate, or the Pod fails to
// start. The agent is asked as soon as the gate's hello names the Pod's IP (hello.go) or
// the Pod has an IP, not only once the kubelet reports the main container running (it
// notices that at its next relist, up to ~1 s later). A main command that ends first is not an error: the exit comes from Wait.
func (b *Backend) waitRunning(ctx context.Context, s *sandbox) (runtime.Info, error) {
	timer := time.NewTimer(b.cfg.StartTimeout)
	defer timer.Stop()
	var (
		pinged   chan error // set while a ping runs
		pingIP   string     // the IP it pings
		stopPing = func() {}
	)
	defer func() { stopPing() }()
	for {
		b.mu.Lock()
		pod, ch, helloIP := s.pod, s.changed, s.helloIP
		ended := false
		select {
		case <-s.done:
			ended = true
		default:
		}
		b.mu.Unlock()
		if err := startError(pod, &s.spec); err != nil {
			return runtime.Info{}, err
		}
		if ended {
			// A group's primary was started by startseq already: ending early is its exit.
			if pod != nil && !mainStarted(pod) && !s.spec.Multi() {
				return runtime.Info{}, startErrorOfEnded(pod)
			}
			return b.info(s), nil
		}
		// The gate's hello comes before the kubelet's report; once the kubelet reports an
		// IP, that one wins: a ping of a hello's IP that differs is replaced, so a hello
		// whose address does not answer cannot hold the create until StartTimeout.
		ip := helloIP
		if pod != nil && pod.Status.PodIP != "" {
			ip = pod.Status.PodIP
		}
		if ip != "" && (pinged == nil || ip != pingIP) {
			stopPing()
			b.mu.Lock()
			if s.steps != nil && s.steps.pinging.IsZero() {
				s.steps.pinging = time.Now()
				b.hookLocked(s, StepPinging, s.steps.pinging)
			}
			b.mu.Unlock()
			pinged, stopPing = b.startPing(ctx, s, ip)
			pingIP = ip
		}
		select {
		case <-ch:
		case err := <-pinged:
			if err == nil {
				b.mu.Lock()
				if s.steps != nil {
					s.steps.ready = time.Now()
					b.hookLocked(s, StepReady, s.steps.ready)
				}
				b.mu.Unlock()
				return b.info(s), nil
			}
			pinged = nil // ctx ended; reported below
		case <-timer.C:
			return runtime.Info{}, fmt.Errorf("the Pod did not start within %s: %s", b.cfg.StartTimeout, podSummary(pod))
		case <-ctx.Done():
			return runtime.Info{}, ctx.Err()
		}
	}
}

// startPing runs pingUntil(ip) until it ends or the returned function is called; its
// result comes on the channel.
func (b *Backend) startPing(ctx context.Context, s *sandbox, ip string) (chan error, func()) {
	pctx, cancel := context.WithCancel(ctx)
	ch := make(chan error, 1)
	go func() { ch <- b.pingUntil(pctx, s, ip) }()
	return ch, cancel
}

func (b *Backend) info(s *sandbox) runtime.Info {
	b.mu.Lock()
	defer b.mu.Unlock()
	return infoOf(s)
}

// pingRetry is how long pingUntil waits after the first failed attempt, doubling up to
// pingRetryMax: the ping starts once the Pod has an IP, when its agent is almost always
// up already, so retries are the fallback (and a gate that keeps refusing is not dialed
// every 10 ms).
const (
	pingRetry    = 10 * time.Millisecond
	pingRetryMax = 200 * time.Millisecond
)

// pingUntil asks the agent until it answers or ctx ends.
func (b *Backend) pingUntil(ctx context.Context, s *sandbox, ip string) error {
	wait := pingRetry
	for {
		err := b.pingAgent(ctx, s, ip)
		if err == nil || ctx.Err() != nil {
			return err
		}
		b.log.Debug("agent not ready", "sandbox", s.id, "err", err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = min(2*wait, pingRetryMax)
	}
}

// pingAgent asks the agent through the gate whether it answers. With an agent identity
// (every sandbox made by this backend has one), a connection whose TLS handshake and
// identity check passed is the answer: it is kept as the sandbox's spare (spare.go
// verifiedSpare) for its first agent client, so that client does not dial and verify
// again. Without one (verifiedSpare says errNoIdentity), a Status.
func (b *Backend) pingAgent(ctx context.Context, s *sandbox, ip string) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := b.verifiedSpare(pctx, s, ip, nil); !errors.Is(err, errNoIdentity) {
		return err
	}
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.dialGate(ctx, s, ip, "") })
	_, err := c.Status(pctx, connect.NewRequest(&agentv1.StatusRequest{}))
	return err
}

func selfSigned(cn string) (tls.Certificate, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(400 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	return cert, certPEM, keyPEM, err
}

func certDER(p []byte) ([]byte, error) {
	blk, _ := pem.Decode(p)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no certificate")
	}
	return blk.Bytes, nil
}
