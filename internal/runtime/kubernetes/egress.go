package kubernetes

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// Host-name egress rules (issue 23; docs/network.md "Kubernetes backend"). NetworkPolicy
// names addresses, never TLS server names, so a sandbox with host-name rules may reach,
// besides its cidr/any/tenant rules, only the runner's egress proxy and the runner's DNS
// (EgressConfig.Peers). Its Pod's only nameserver is the runner's DNS, which answers a
// name its rules grant with the proxy's address (internal/egress steer.go); the proxy
// reads the TLS server name, checks it against the grants of the connection's source
// address, resolves it itself and splices. Both look the source up in the registry
// below: the Pod IPs of this runner's own running sandbox Pods, from the informer. An
// address the registry does not hold is no sandbox: refused.

// EgressConfig turns host-name egress rules on (Config.Egress).
type EgressConfig struct {
	// ProxyAddrs are what the runner's DNS answers for a granted name: where the Pods
	// reach the egress proxy on port 443 (the egress Service's ClusterIPs, one per
	// family). At least one.
	ProxyAddrs []netip.Addr
	// DNSAddr is the Pods' only nameserver (port 53): the runner's DNS.
	DNSAddr netip.Addr
	// Peers select the runner's Pod in the sandboxes' NetworkPolicies (pod and namespace
	// selectors, or its address as an ipBlock); ProxyPort and DNSPort are the ports the
	// traffic arrives at after a Service's translation (what NetworkPolicy sees: the
	// runner's listen ports). At least one peer.
	Peers              []networkingv1.NetworkPolicyPeer
	ProxyPort, DNSPort int
	// Roots is the public CA bundle sandboxes with egress secrets trust besides their
	// own CA (bundle.pem starts with it; egress.ReadRoots): New writes it into the
	// runner's ConfigMap gate.EgressRootsConfigMapName(RunnerID) of the namespace, once
	// for all its sandboxes. PEM certificates only (New refuses anything else), at most
	// MaxEgressRoots; nil: bundle.pem is the sandbox CA alone.
	Roots []byte
	// RootsFile is the file Roots was read from (--egress-roots; "": the first system
	// bundle found), named by New's refusals.
	RootsFile string
}

// MaxEgressRoots bounds EgressConfig.Roots, written into the runner's ConfigMap
// gate.EgressRootsConfigMapName (a ConfigMap holds at most 1 MiB).
const MaxEgressRoots = 900 << 10

func (c *EgressConfig) check() error {
	switch {
	case len(c.ProxyAddrs) == 0:
		return errors.New("no proxy address")
	case !c.DNSAddr.IsValid():
		return errors.New("no DNS address")
	case len(c.Peers) == 0:
		return errors.New("no NetworkPolicy peer for the runner")
	case c.ProxyPort < 1 || c.ProxyPort > 65535 || c.DNSPort < 1 || c.DNSPort > 65535:
		return fmt.Errorf("proxy port %d and DNS port %d: want 1-65535", c.ProxyPort, c.DNSPort)
	case len(c.Roots) > MaxEgressRoots:
		return fmt.Errorf("%s has %d bytes, at most %d (a ConfigMap's limit): give a smaller one (--egress-roots)", c.rootsName(), len(c.Roots), MaxEgressRoots)
	case len(c.Roots) > 0 && !x509.NewCertPool().AppendCertsFromPEM(c.Roots):
		return fmt.Errorf("%s holds no PEM certificate: want a PEM file of CA certificates, such as /etc/ssl/certs/ca-certificates.crt (--egress-roots)", c.rootsName())
	}
	for _, a := range c.ProxyAddrs {
		if !a.IsValid() {
			return errors.New("an invalid proxy address")
		}
	}
	return nil
}

// rootsName names Roots in New's refusals: its file, or the system bundle.
func (c *EgressConfig) rootsName() string {
	if c.RootsFile != "" {
		return "the roots bundle --egress-roots " + c.RootsFile
	}
	return "the roots bundle (the system bundle the runner found)"
}

// egressSource is one registered source address: the sandbox whose Pod holds it.
type egressSource struct {
	id     string
	uid    types.UID
	org    string // the sandbox's organization: the egress DNS and proxy bound each org's share
	grants []string
	// secrets: what the proxy injects for this source (nil: none); injectHosts: the
	// hosts the spec's rules attach secrets to (refused when secrets is nil: lost).
	secrets     *egress.SandboxSecrets
	injectHosts []string
}

// hostNameGrants are the spec's dns_name patterns, lower-cased without a trailing dot;
// nil without any (or under deny-all egress, which grants nothing).
func hostNameGrants(spec *runtime.Spec) []string {
	n := spec.Network
	if n == nil || n.DenyEgress {
		return nil
	}
	var out []string
	for _, r := range n.Egress {
		if r.DNSName != "" {
			out = append(out, strings.ToLower(strings.TrimSuffix(r.DNSName, ".")))
		}
	}
	return out
}

// usesEgress: s's spec has host-name rules and the backend serves them.
func (b *Backend) usesEgress(spec *runtime.Spec) bool {
	return b.cfg.Egress != nil && len(hostNameGrants(spec)) > 0
}

// EgressSource returns the host-name patterns granted to the sandbox Pod at src and
// whether src is one (for egress.Steering.Source).
func (b *Backend) EgressSource(src netip.Addr) ([]string, bool) {
	b.egressMu.RLock()
	defer b.egressMu.RUnlock()
	e := b.egressBySrc[src.Unmap()]
	if e == nil {
		return nil, false
	}
	return e.grants, true
}

// EgressGroup returns the organization of the sandbox Pod at src ("" for none or an
// unregistered address), for egress.Steering.Group and egress.Proxy.Group: one
// organization's sandboxes together hold a bounded share of the DNS's and the proxy's
// slots.
func (b *Backend) EgressGroup(src netip.Addr) string {
	b.egressMu.RLock()
	defer b.egressMu.RUnlock()
	if e := b.egressBySrc[src.Unmap()]; e != nil {
		return e.org
	}
	return ""
}

// EgressKnown reports whether src is a registered sandbox Pod (for egress.Proxy.Known).
func (b *Backend) EgressKnown(src netip.Addr) bool {
	_, ok := b.EgressSource(src)
	return ok
}

// EgressGrants returns the host-name patterns granted to the sandbox Pod at src; nil for
// an address that is no registered sandbox (for egress.Proxy.Grants).
func (b *Backend) EgressGrants(src netip.Addr) []string {
	g, _ := b.EgressSource(src)
	return g
}

// egressObserveLocked brings the registry in line with s's Pod as last seen: its IPs are
// registered while the Pod is this runner's, is s's (its UID), and neither ends nor is
// being deleted; they are removed at the first sign of its end, and an IP that changed
// is replaced. Called with b.mu held, on every informer event (evaluateLocked).
func (b *Backend) egressObserveLocked(s *sandbox) {
	if b.cfg.Egress == nil {
		return
	}
	var want []netip.Addr
	grants := hostNameGrants(&s.spec)
	p := s.pod
	live := len(grants) > 0 && p != nil && s.uid != "" && p.UID == s.uid && !s.deleted && !s.egressOff &&
		p.DeletionTimestamp == nil && !podEnded(p) &&
		p.Labels[LabelManagedBy] == ManagedBy && p.Labels[LabelRunner] == b.cfg.RunnerID && p.Labels[LabelSandbox] == s.id
	if live {
		select {
		case <-s.done:
			live = false // the sandbox has ended (a writer's Pod outlives its workload)
		default:
		}
	}
	if live {
		ips := p.Status.PodIPs
		if len(ips) == 0 && p.Status.PodIP != "" {
			ips = []corev1.PodIP{{IP: p.Status.PodIP}}
		}
		for _, ip := range ips {
			if a, err := netip.ParseAddr(ip.IP); err == nil && !slices.Contains(want, a.Unmap()) {
				want = append(want, a.Unmap())
			}
		}
	}
	if slices.Equal(want, s.egressIPs) {
		return
	}
	b.egressMu.Lock()
	defer b.egressMu.Unlock()
	for _, a := range s.egressIPs {
		if e := b.egressBySrc[a]; e != nil && e.id == s.id && e.uid == s.uid && !slices.Contains(want, a) {
			delete(b.egressBySrc, a)
		}
	}
	var hosts []string
	for _, r := range s.spec.Network.EgressSecrets() {
		hosts = append(hosts, r.DNSName)
	}
	for _, a := range want {
		b.egressBySrc[a] = &egressSource{id: s.id, uid: s.uid, org: s.spec.Meta[runtime.MetaOrg], grants: grants,
			secrets: s.egress, injectHosts: hosts}
	}
	s.egressIPs = want
}

// egressForgetLocked removes s's addresses (before the backend deletes its Pod).
func (b *Backend) egressForgetLocked(s *sandbox) {
	if len(s.egressIPs) == 0 {
		return
	}
	b.egressMu.Lock()
	defer b.egressMu.Unlock()
	for _, a := range s.egressIPs {
		if e := b.egressBySrc[a]; e != nil && e.id == s.id && e.uid == s.uid {
			delete(b.egressBySrc, a)
		}
	}
	s.egressIPs = nil
}

// waitEgress waits until s's Pod has an address in the egress registry (at most the
// start timeout), so that its workload's first query is answered; at once for a
// sandbox without host-name rules.
func (b *Backend) waitEgress(ctx context.Context, s *sandbox) error {
	if !b.usesEgress(&s.spec) {
		return nil
	}
	timeout := time.NewTimer(b.cfg.StartTimeout)
	defer timeout.Stop()
	for {
		b.mu.Lock()
		ok, changed := len(s.egressIPs) > 0, s.changed
		b.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-s.done:
			return errors.New("the Pod ended before its address was known for its host-name egress rules")
		case <-timeout.C:
			return errors.New("the Pod's address was not reported in time for its host-name egress rules")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// egressPolicyRule is the NetworkPolicy egress rule of a sandbox with host-name rules:
// the runner's proxy (TCP) and DNS (UDP and TCP), nothing else.
func (b *Backend) egressPolicyRule() networkingv1.NetworkPolicyEgressRule {
	e := b.cfg.Egress
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	proxy, dns := intstr.FromInt(e.ProxyPort), intstr.FromInt(e.DNSPort)
	return networkingv1.NetworkPolicyEgressRule{
		To: slices.Clone(e.Peers),
		Ports: []networkingv1.NetworkPolicyPort{
			{Protocol: &tcp, Port: &proxy}, {Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns},
		},
	}
}

// checkEgress refuses what host-name rules cannot do here: egress secrets without the
// runner's egress proxy, egress secrets beside init containers (their agents are not
// held and the gate is not up while they run: the placeholders could only travel in the
// sandbox Secret, i.e. etcd), and a container that adds NET_RAW (raw sockets could forge
// another Pod's source address, which is what the grants are keyed by).
func (b *Backend) checkEgress(spec *runtime.Spec) error {
	if spec.Network == nil {
		return b.checkNetRaw(spec)
	}
	for i, r := range spec.Network.Egress {
		switch {
		case r.Secret == nil:
		case b.cfg.Egress == nil:
			return fmt.Errorf("%w: network.egress[%d].sandboxd_secret: this Kubernetes runner has no egress proxy to inject egress secrets (--egress-proxy-listen)", runtime.ErrInvalidSpec, i)
		case b.noEgressSecrets != "":
			return fmt.Errorf("%w: network.egress[%d].sandboxd_secret: this Kubernetes runner gives no egress secrets: %s", runtime.ErrInvalidSpec, i, b.noEgressSecrets)
		case spec.Network.DenyEgress:
			return fmt.Errorf("%w: network.egress[%d].sandboxd_secret: an egress secret under deny-all egress reaches no host: drop deny_egress or the secret", runtime.ErrInvalidSpec, i)
		case len(spec.InitContainers) > 0:
			return fmt.Errorf("%w: network.egress[%d].sandboxd_secret: egress secrets are not given to sandboxes with init containers on Kubernetes runners yet (init containers start before the runner can hand them their placeholders); drop the init containers or use a local runner", runtime.ErrInvalidSpec, i)
		}
	}
	return b.checkNetRaw(spec)
}

// EgressSecrets is what the egress proxy injects for the sandbox Pod at src (for
// egress.Proxy.Secrets): its secrets, or, for a sandbox whose rules carry secrets this
// process was not given (recovered after a restart: the values and the CA key were in
// the old process's memory only), a record that refuses its connections to those hosts
// (as on the local backend); nil for an address that is no such sandbox.
func (b *Backend) EgressSecrets(src netip.Addr) *egress.SandboxSecrets {
	b.egressMu.RLock()
	e := b.egressBySrc[src.Unmap()]
	b.egressMu.RUnlock()
	switch {
	case e == nil:
		return nil
	case e.secrets != nil:
		return e.secrets
	case len(e.injectHosts) > 0:
		return egress.LostSecrets(e.id, e.org, e.injectHosts)
	}
	return nil
}

// prepareEgressSecrets makes the CA and placeholders of a new sandbox whose rules carry
// egress secrets (nil, nil without). The values stay in the returned secrets (runner
// memory); the placeholders go to the workload only through its agent's Start (the
// gate channel), never into an API object.
func prepareEgressSecrets(spec *runtime.Spec) (*egress.SandboxSecrets, map[string]string, error) {
	rules := spec.Network.EgressSecrets()
	if len(rules) == 0 {
		return nil, nil, nil
	}
	var egRules []egress.Rule
	for _, r := range rules {
		sec := r.Secret
		egRules = append(egRules, egress.Rule{Host: r.DNSName, Header: sec.HeaderName(), Secret: sec.Key(), EnvVar: sec.EnvVar})
	}
	ss, ph, err := egress.Build(spec.ID, spec.Meta[runtime.MetaOrg], egRules, spec.EgressSecretValues)
	if errors.Is(err, egress.ErrNoValue) {
		return nil, nil, fmt.Errorf("%w: %w", runtime.ErrInvalidSpec, err)
	}
	return ss, ph, err
}

// egressStartEnv is the environment of c's Start config: its own, with the placeholders
// and the trust variables (egress.ContainerEnv) when the sandbox has egress secrets.
func egressStartEnv(c *runtime.Container, placeholders map[string]string) []string {
	if placeholders == nil {
		return agentconfig.MergeEnv(nil, c.Env)
	}
	add := egress.ContainerEnv(nil, func(k string) bool { _, set := c.Env[k]; return set }, placeholders)
	env := maps.Clone(c.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, add)
	return agentconfig.MergeEnv(nil, env)
}

// writeEgressRoots writes runner runnerID's roots ConfigMap
// (gate.EgressRootsConfigMapName): create, or update one that differs (again on a
// conflict with a concurrent writer, a replica of the same runner).
func writeEgressRoots(ctx context.Context, client k8s.Interface, ns, runnerID string, roots []byte) error {
	name := gate.EgressRootsConfigMapName(runnerID)
	data := map[string]string{gate.EgressRootsFile: string(roots)}
	cms := client.CoreV1().ConfigMaps(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		old, err := cms.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			cm := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelManagedBy: ManagedBy, LabelRunner: runnerID}},
				Data:       data,
			}
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) { // made meanwhile: read it again
				return apierrors.NewConflict(corev1.Resource("configmaps"), name, err)
			}
			return err
		case err != nil:
			return err
		case maps.Equal(old.Data, data) && old.Labels[LabelRunner] == runnerID && old.Labels[LabelManagedBy] == ManagedBy:
			return nil
		}
		old.Data = data
		if old.Labels == nil {
			old.Labels = map[string]string{}
		}
		old.Labels[LabelManagedBy], old.Labels[LabelRunner] = ManagedBy, runnerID
		_, err = cms.Update(ctx, old, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("roots ConfigMap %s: %w", name, err)
	}
	return nil
}

// applyEgressSecretsPod gives the Pod of a sandbox with egress secrets its trust
// material: the gate mounts the sandbox CA's certificate (the sandbox Secret's item
// gate.EgressCAFile: public) and the roots ConfigMap, and its install writes ca.pem and
// bundle.pem into an emptyDir that every other container mounts read-only at
// egress.CAMount. No key, value or placeholder is in the Pod.
func applyEgressSecretsPod(pod *corev1.Pod, spec *runtime.Spec, runnerID string) {
	if len(spec.Network.EgressSecrets()) == 0 {
		return
	}
	const src, out = "egress-src", "egress-ca"
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: src, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			DefaultMode: ptr(int32(0o444)),
			Sources: []corev1.VolumeProjection{
				{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: secretName(spec.ID)},
					Items: []corev1.KeyToPath{{Key: gate.EgressCAFile, Path: gate.EgressCAFile}}}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: gate.EgressRootsConfigMapName(runnerID)},
					Items: []corev1.KeyToPath{{Key: gate.EgressRootsFile, Path: gate.EgressRootsFile}}, Optional: ptr(true)}},
			},
		}}},
		corev1.Volume{Name: out, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
	)
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Name == containerGate {
			c.VolumeMounts = append(c.VolumeMounts,
				corev1.VolumeMount{Name: src, MountPath: gate.EgressSrcDir, ReadOnly: true},
				corev1.VolumeMount{Name: out, MountPath: gate.EgressDir})
			continue
		}
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: out, MountPath: egress.CAMount, ReadOnly: true})
	}
}

// checkNetRaw refuses CAP_NET_RAW in any container of any spec on a runner that serves
// host-name rules (Config.Egress), whether or not this spec has such rules: the grants
// are keyed by source address, and raw sockets in any of this runner's Pods could forge
// a registered Pod's address on a CNI without anti-spoofing.
func (b *Backend) checkNetRaw(spec *runtime.Spec) error {
	if b.cfg.Egress == nil {
		return nil
	}
	for _, c := range spec.AllContainers() {
		if c.Security != nil && (slices.Contains(c.Security.CapAdd, "CAP_NET_RAW") || slices.Contains(c.Security.CapAdd, "ALL") || slices.Contains(c.Security.CapAdd, "CAP_ALL")) {
			return fmt.Errorf("%w: container %q: security.cap_add: CAP_NET_RAW is not allowed on Kubernetes runners that serve host-name egress rules (raw sockets could forge another sandbox's address)", runtime.ErrInvalidSpec, c.ContainerName())
		}
	}
	return nil
}

// applyEgressPod drops NET_RAW in every container of every sandbox Pod of a runner that
// serves host-name rules, and gives the Pod of a sandbox with such rules the runner's
// DNS as its only nameserver (no search domains, ndots 1: a name is looked up as it
// is). Pods without host-name rules keep the cluster's DNS.
func (b *Backend) applyEgressPod(pod *corev1.Pod, spec *runtime.Spec) {
	if b.cfg.Egress == nil {
		return
	}
	// Every sandbox Pod of a runner serving host-name rules, with such rules or not:
	// none may forge a registered Pod's address with a raw socket.
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			dropNetRaw(&cs[i])
		}
	}
	if !b.usesEgress(spec) {
		return
	}
	pod.Spec.DNSPolicy = corev1.DNSNone
	pod.Spec.DNSConfig = &corev1.PodDNSConfig{
		Nameservers: []string{b.cfg.Egress.DNSAddr.String()},
		Options:     []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("1")}},
	}
}

func dropNetRaw(c *corev1.Container) {
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	if c.SecurityContext.Capabilities == nil {
		c.SecurityContext.Capabilities = &corev1.Capabilities{}
	}
	caps := c.SecurityContext.Capabilities
	caps.Add = slices.DeleteFunc(caps.Add, func(c corev1.Capability) bool { return c == "NET_RAW" || c == "ALL" })
	if !slices.Contains(caps.Drop, "ALL") && !slices.Contains(caps.Drop, "NET_RAW") {
		caps.Drop = append(caps.Drop, "NET_RAW")
	}
}
