package main

import (
	"flag"
	"io"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
)

func TestRunnerPeers(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "runners")
	for _, tc := range []struct {
		name, cidrs, pods string
		want              []string // per peer: "ip:CIDR" or "ns:NS pods:SELECTOR"
		err               string
	}{
		{name: "none"},
		{name: "cidrs", cidrs: "192.0.2.7/32, 10.1.2.3/16", want: []string{"ip:192.0.2.7/32", "ip:10.1.0.0/16"}},
		{name: "pods in the runner's namespace", pods: "app.kubernetes.io/name=sandboxd-runner,app.kubernetes.io/instance=r",
			want: []string{"ns:runners pods:app.kubernetes.io/instance=r,app.kubernetes.io/name=sandboxd-runner"}},
		{name: "bad cidr", cidrs: "10.0.0.1", err: "--runner-peer-cidrs"},
		{name: "bad selector", pods: "a=b=c", err: "--runner-peer-pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := kubernetesFlags{namespace: "sandboxes", peerCIDRs: tc.cidrs, peerPods: tc.pods}
			peers, err := k.runnerPeers()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range peers {
				switch {
				case p.IPBlock != nil:
					got = append(got, "ip:"+p.IPBlock.CIDR)
				case p.PodSelector != nil:
					var kv []string
					for _, k := range []string{"app.kubernetes.io/instance", "app.kubernetes.io/name"} {
						kv = append(kv, k+"="+p.PodSelector.MatchLabels[k])
					}
					got = append(got, "ns:"+p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]+" pods:"+strings.Join(kv, ","))
				}
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("peers %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPlatformRegistryFlag(t *testing.T) {
	for v, ok := range map[string]bool{"": true, "gw.example:8443": true, "10.0.0.5:8080": true,
		"http://gw.example": false, "gw.example/org": false, "gw example": false} {
		k := kubernetesFlags{agentImage: "agent:1", pullPolicy: "IfNotPresent", platformRegistry: v}
		if err := k.validate(); (err == nil) != ok {
			t.Errorf("--platform-registry %q: %v, want ok %v", v, err, ok)
		}
	}
}

// TestInstalledRunnerHello: the installer's runner arguments (the chart's defaults;
// internal/install TestHelloCopiesAgree and test/k8s TestChartHello hold the chart and the
// manifest to them), as Kubernetes expands $(POD_IP) for an IPv4 and an IPv6 Pod, parse
// and validate as the runner's: the hello listens on the container's UDP port "hello", its
// address is the Pod's own IP on that port, and --runner-peer-pods (the peer every
// sandbox NetworkPolicy's hello rule names) selects exactly the runner's Pods in its
// namespace. Two empty flags appended (--install-runner-arg) turn the hello off.
func TestInstalledRunnerHello(t *testing.T) {
	v := install.Values{Namespace: "sandboxd-r1", Image: "i", AgentImage: "a"}
	var d *appsv1.Deployment
	for _, o := range install.Objects(v) {
		if x, ok := o.(*appsv1.Deployment); ok {
			d = x
		}
	}
	c := d.Spec.Template.Spec.Containers[0]
	var port int32
	for _, p := range c.Ports {
		if p.Name == "hello" && p.Protocol == corev1.ProtocolUDP {
			port = p.ContainerPort
		}
	}
	if port == 0 {
		t.Fatalf("no UDP port hello in %+v", c.Ports)
	}
	t.Setenv("POD_NAMESPACE", v.Namespace) // the downward API's, as the container has it
	parse := func(t *testing.T, args []string) kubernetesFlags {
		t.Helper()
		cfg := new(runnerConfig)
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.bind(fs)
		if args[0] != "runner" {
			t.Fatalf("args %q", args)
		}
		if err := fs.Parse(args[1:]); err != nil {
			t.Fatal(err)
		}
		if err := cfg.validate(); err != nil {
			t.Fatalf("validate: %v", err)
		}
		return cfg.kube
	}
	for _, podIP := range []string{"10.244.0.7", "fd00:10:244::7"} {
		t.Run(podIP, func(t *testing.T) {
			var args []string
			for _, a := range c.Args {
				args = append(args, strings.ReplaceAll(a, "$(POD_IP)", podIP)) // the kubelet's expansion
			}
			k := parse(t, args)
			if _, p, err := net.SplitHostPort(k.helloListen); err != nil || p != strconv.Itoa(int(port)) {
				t.Errorf("--hello-listen %q: want the port %d", k.helloListen, port)
			}
			host, p, err := net.SplitHostPort(os.ExpandEnv(k.helloAddr))
			if err != nil || host != podIP || p != strconv.Itoa(int(port)) {
				t.Errorf("--hello-addr %q: want %s port %d (%v)", k.helloAddr, podIP, port, err)
			}
			peers, err := k.runnerPeers()
			if err != nil || len(peers) != 1 || peers[0].PodSelector == nil {
				t.Fatalf("peers %+v %v: want the runner's Pods", peers, err)
			}
			sel, err := metav1.LabelSelectorAsSelector(peers[0].PodSelector)
			if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("peer %v does not select the runner's Pods %v", peers[0].PodSelector, d.Spec.Template.Labels)
			}
			if ns := peers[0].NamespaceSelector.MatchLabels[corev1.LabelMetadataName]; ns != d.Namespace {
				t.Errorf("peer namespace %q, the runner's %q", ns, d.Namespace)
			}
		})
	}
	off := parse(t, append(append([]string(nil), c.Args...), "--hello-listen=", "--hello-addr="))
	if off.helloListen != "" || off.helloAddr != "" {
		t.Errorf("turned off: %q %q", off.helloListen, off.helloAddr)
	}
}

// TestInstalledRunnerRuntimeClasses: the installer's --runtime-classes (the control plane's
// --install-runtime-classes, as it parses it) is taken by the runner's flags as the same
// classes; without any, the runner gets no --runtime-classes (runc only).
func TestInstalledRunnerRuntimeClasses(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "sandboxd-r1")
	for _, list := range []string{"", "runc=", "gvisor=gvisor,runc=", "runc=,kata=kata-qemu,gvisor=gvisor.example.com"} {
		cp := new(controlPlaneConfig)
		fs := flag.NewFlagSet("cp", flag.ContinueOnError)
		cp.bind(fs)
		if err := fs.Parse([]string{"--install-runtime-classes=" + list}); err != nil {
			t.Fatal(err)
		}
		if err := cp.validate(); err != nil {
			t.Fatalf("%q: %v", list, err)
		}
		want := cp.installConfig().RuntimeClasses
		args := install.Args(install.Values{Namespace: "sandboxd-r1", Image: "i", AgentImage: "a", RuntimeClasses: want})
		cfg := new(runnerConfig)
		rfs := flag.NewFlagSet("runner", flag.ContinueOnError)
		rfs.SetOutput(io.Discard)
		cfg.bind(rfs)
		if err := rfs.Parse(args[1:]); err != nil {
			t.Fatal(err)
		}
		if err := cfg.validate(); err != nil {
			t.Fatalf("%q: runner validate: %v", list, err)
		}
		got, err := cfg.kube.runtimeClassMap()
		if err != nil || !maps.Equal(got, want) || (list == "") != (got == nil) {
			t.Errorf("%q: the runner takes %v (%v), want %v", list, got, err, want)
		}
	}
}

// TestRuntimeClassesFlag: the runner's --runtime-classes is checked when its flags are
// (validate, before it starts anything), as the chart and the installer check it
// (install.ParseRuntimeClasses), each refusal naming the flag; what validates is what the
// backend gets.
func TestRuntimeClassesFlag(t *testing.T) {
	many := "runc="
	for i := 1; i <= install.MaxRuntimeClasses; i++ { // one more than the bound
		many += ",c" + strconv.Itoa(i) + "=rc"
	}
	for _, c := range []struct {
		list string
		want map[string]string
		err  string
	}{
		{list: ""},
		{list: "runc=", want: map[string]string{"runc": ""}},
		{list: " runc= ,gvisor=gvisor", want: map[string]string{"runc": "", "gvisor": "gvisor"}},
		{list: "gvisor=gvisor", err: "--runtime-classes: runtime classes: no entry for runc"},
		{list: "runc=,gVisor=gvisor", err: `--runtime-classes: runtime class "gVisor": want a DNS label`},
		{list: "runc=,gvisor=run_sc", err: `--runtime-classes: runtime class "gvisor": RuntimeClass name "run_sc"`},
		{list: "runc=,gvisor", err: `--runtime-classes: runtime classes: "gvisor": want class=RuntimeClass`},
		{list: "runc=,runc=x", err: `--runtime-classes: runtime classes: class "runc" given twice`},
		{list: many, err: "--runtime-classes: runtime classes: more than 16 classes"},
	} {
		k := kubernetesFlags{agentImage: "agent:1", pullPolicy: "IfNotPresent", runtimeClasses: c.list}
		err := k.validate()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: validate %v, want %q", c.list, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: validate %v", c.list, err)
			continue
		}
		if got, err := k.runtimeClassMap(); err != nil || !maps.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("%q: the backend gets %v (%v), want %v", c.list, got, err, c.want)
		}
	}
}

// TestEgressFlags: the --egress-* flags go together with a runner peer, the listen
// addresses need ports, the proxy addresses are IPs (one per family), and none at all
// leaves host-name rules off.
func TestEgressFlags(t *testing.T) {
	full := func(mod func(k *kubernetesFlags)) kubernetesFlags {
		k := kubernetesFlags{agentImage: "agent:1", pullPolicy: "IfNotPresent", peerPods: "app=runner",
			egressProxyListen: "0.0.0.0:15443", egressDNSListen: "0.0.0.0:5353",
			egressProxyAddrs: "10.96.0.53,fd00::53", egressDNSAddr: "10.96.0.53"}
		if mod != nil {
			mod(&k)
		}
		return k
	}
	k := full(nil)
	eg, err := k.egress()
	if err != nil || eg == nil || len(eg.ProxyAddrs) != 2 || eg.DNSAddr.String() != "10.96.0.53" || eg.ProxyListen != "0.0.0.0:15443" || eg.DNSListen != "0.0.0.0:5353" {
		t.Fatalf("full flags: %+v, %v", eg, err)
	}
	if err := k.validate(); err != nil {
		t.Errorf("full flags: %v", err)
	}
	k.egressForbid = "34.118.224.0/20, 2001:db8::/64"
	if eg, err := k.egress(); err != nil || len(eg.Forbid) != 2 || eg.Forbid[0].String() != "34.118.224.0/20" {
		t.Errorf("--egress-forbid: %+v, %v", eg, err)
	}
	// An IPv4-mapped range is forbidden as its IPv4 one (the proxy compares unmapped).
	k.egressForbid = "::ffff:34.118.224.0/116"
	if eg, err := k.egress(); err != nil || len(eg.Forbid) != 1 || eg.Forbid[0].String() != "34.118.224.0/20" {
		t.Errorf("--egress-forbid IPv4-mapped: %+v, %v; want 34.118.224.0/20", eg, err)
	}
	off := kubernetesFlags{agentImage: "agent:1", pullPolicy: "IfNotPresent"}
	if eg, err := off.egress(); eg != nil || err != nil {
		t.Errorf("no flags: %+v, %v; want off", eg, err)
	}
	for name, mod := range map[string]func(k *kubernetesFlags){
		"one missing":       func(k *kubernetesFlags) { k.egressDNSAddr = "" },
		"no runner peer":    func(k *kubernetesFlags) { k.peerPods = "" },
		"listen sans port":  func(k *kubernetesFlags) { k.egressProxyListen = "0.0.0.0" },
		"port 0":            func(k *kubernetesFlags) { k.egressDNSListen = "0.0.0.0:0" },
		"a name, not an IP": func(k *kubernetesFlags) { k.egressProxyAddrs = "egress.sandboxd.svc" },
		"two IPv4":          func(k *kubernetesFlags) { k.egressProxyAddrs = "10.96.0.53,10.96.0.54" },
		"bad DNS address":   func(k *kubernetesFlags) { k.egressDNSAddr = "10.96.0" },
		"bad forbid":        func(k *kubernetesFlags) { k.egressForbid = "34.118.224.0/200" },
		"proxy unspecified": func(k *kubernetesFlags) { k.egressProxyAddrs = "0.0.0.0" },
		"proxy :: ":         func(k *kubernetesFlags) { k.egressProxyAddrs = "10.96.0.53,::" },
		"proxy loopback":    func(k *kubernetesFlags) { k.egressProxyAddrs = "127.0.0.1" },
		"proxy mapped loop": func(k *kubernetesFlags) { k.egressProxyAddrs = "::ffff:127.0.0.1" },
		"proxy multicast":   func(k *kubernetesFlags) { k.egressProxyAddrs = "224.0.0.1" },
		"proxy link-local":  func(k *kubernetesFlags) { k.egressProxyAddrs = "169.254.1.1" },
		"dns unspecified":   func(k *kubernetesFlags) { k.egressDNSAddr = "::" },
		"dns loopback":      func(k *kubernetesFlags) { k.egressDNSAddr = "::1" },
		"dns multicast":     func(k *kubernetesFlags) { k.egressDNSAddr = "ff02::1" },
		"dns link-local":    func(k *kubernetesFlags) { k.egressDNSAddr = "fe80::1" },
		"forbid mapped /80": func(k *kubernetesFlags) { k.egressForbid = "::ffff:0:0/80" },
	} {
		k := full(mod)
		if err := k.validate(); err == nil || !strings.Contains(err.Error(), "--egress") {
			t.Errorf("%s: %v, want an --egress-* error", name, err)
		}
	}
}

// TestRunnerNodeAgentFlags: --node-agent-port or --node-agent-addrs (not both) with
// --node-agent-tls-dir; bad ones are refused at validate with the flag's name; none
// leaves pause off.
func TestRunnerNodeAgentFlags(t *testing.T) {
	parse := func(args ...string) kubernetesFlags {
		t.Helper()
		var k kubernetesFlags
		fs := flag.NewFlagSet("runner", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		k.register(fs)
		if err := fs.Parse(append([]string{"--agent-image", "agent:1"}, args...)); err != nil {
			t.Fatal(err)
		}
		return k
	}
	k := parse()
	if err := k.validate(); err != nil {
		t.Fatal(err)
	}
	if c, err := k.nodeAgents(); err != nil || c.Enabled() {
		t.Errorf("no flags: %+v %v, want none", c, err)
	}
	k = parse("--node-agent-port", "7445", "--node-agent-tls-dir", "/etc/na")
	if err := k.validate(); err != nil {
		t.Fatal(err)
	}
	if c, err := k.nodeAgents(); err != nil || c.Port != 7445 || c.TLSDir != "/etc/na" || c.Addrs != nil {
		t.Errorf("port: %+v %v", c, err)
	}
	k = parse("--node-agent-port", "7445", "--node-agent-tls-dir", "/etc/na", "--node-agent-node-gone-after", "90s")
	if c, err := k.nodeAgents(); err != nil || c.NodeGoneAfter != 90*time.Second {
		t.Errorf("gone after: %+v %v", c, err)
	}
	k = parse("--node-agent-addrs", "node-1=10.0.0.1:7445,node-2=10.0.0.2:7445", "--node-agent-tls-dir", "/etc/na")
	if c, err := k.nodeAgents(); err != nil || len(c.Addrs) != 2 || c.Addrs["node-2"] != "10.0.0.2:7445" {
		t.Errorf("addrs: %+v %v", c, err)
	}
	// The runner issues the certificates: two Secrets of its own namespace.
	t.Setenv("POD_NAMESPACE", "sandboxd-r1")
	k = parse("--node-agent-port", "7445", "--node-agent-issue-secrets", "rel-node-agent")
	if err := k.validate(); err != nil {
		t.Fatal(err)
	}
	if c, err := k.nodeAgents(); err != nil || c.TLSDir != "" || c.Issue == nil ||
		*c.Issue != (nodeagentdial.IssueConfig{Namespace: "sandboxd-r1", CASecret: "rel-node-agent-ca", ServerSecret: "rel-node-agent-server"}) {
		t.Errorf("issue: %+v %v", c, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node-agent-port", "7445"}, "need --node-agent-tls-dir"},
		{[]string{"--node-agent-port", "7445", "--node-agent-tls-dir", "/x", "--node-agent-issue-secrets", "p"}, "--node-agent-tls-dir and --node-agent-issue-secrets: give one"},
		{[]string{"--node-agent-issue-secrets", "p"}, "--node-agent-issue-secrets needs --node-agent-port"},
		{[]string{"--node-agent-port", "7445", "--node-agent-issue-secrets", "Bad_Name"}, `--node-agent-issue-secrets: node agent certificates: Secret name "Bad_Name-ca"`},
		{[]string{"--node-agent-addrs", "n=10.0.0.1:1", "--node-agent-tls-dir", "/x", "--node-agent-node-gone-after", "1m"}, "--node-agent-node-gone-after needs --node-agent-port"},
		{[]string{"--node-agent-tls-dir", "/etc/na"}, "--node-agent-tls-dir needs --node-agent-port or --node-agent-addrs"},
		{[]string{"--node-agent-port", "99999", "--node-agent-tls-dir", "/x"}, "--node-agent-port 99999: want 1..65535"},
		{[]string{"--node-agent-port", "7445", "--node-agent-addrs", "n=10.0.0.1:1", "--node-agent-tls-dir", "/x"}, "give one"},
		{[]string{"--node-agent-addrs", "n=10.0.0.1:1,n=10.0.0.2:1", "--node-agent-tls-dir", "/x"}, `--node-agent-addrs: node "n" twice`},
		{[]string{"--node-agent-addrs", "n:10.0.0.1", "--node-agent-tls-dir", "/x"}, "--node-agent-addrs: \"n:10.0.0.1\": want node=host:port"},
		{[]string{"--node-agent-addrs", "n=10.0.0.1", "--node-agent-tls-dir", "/x"}, "--node-agent-addrs: node n: \"10.0.0.1\": want host:port"},
	} {
		k := parse(tc.args...)
		if err := k.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestInstalledRunnerEgress: the installer's runner arguments with egress on
// (--install-egress), the egress Service's variable expanded as the kubelet does
// (SANDBOXD_RUNNER_EGRESS_SERVICE_HOST, the Service's ClusterIP), parse and validate as the
// runner's: the proxy and DNS listen on the container's egress ports and tell the sandboxes
// the Service's address. The literal $(…) (a kubelet that had not seen the Service yet) is
// refused, as the chart's runner refuses it.
func TestInstalledRunnerEgress(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "sandboxd-r1")
	v := install.Values{Namespace: "sandboxd-r1", Image: "i", AgentImage: "a", Egress: true}
	var d *appsv1.Deployment
	for _, o := range install.Objects(v) {
		if x, ok := o.(*appsv1.Deployment); ok {
			d = x
		}
	}
	c := d.Spec.Template.Spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name+"/"+string(p.Protocol)] = p.ContainerPort
	}
	parse := func(ip string) (*kubernetesFlags, error) {
		cfg := new(runnerConfig)
		fs := flag.NewFlagSet("runner", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.bind(fs)
		var args []string
		for _, a := range c.Args[1:] {
			a = strings.ReplaceAll(a, "$(POD_IP)", "10.244.0.7")
			if ip != "" {
				a = strings.ReplaceAll(a, "$(SANDBOXD_RUNNER_EGRESS_SERVICE_HOST)", ip)
			}
			args = append(args, a)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return &cfg.kube, cfg.validate()
	}
	k, err := parse("10.96.0.53")
	if err != nil {
		t.Fatalf("validate: %v", err)
	}
	eg, err := k.egress()
	if err != nil || eg == nil {
		t.Fatalf("egress %+v %v", eg, err)
	}
	if _, p, _ := net.SplitHostPort(eg.ProxyListen); p != strconv.Itoa(int(ports["egress-proxy/"])) || ports["egress-proxy/"] == 0 {
		t.Errorf("proxy listens on %q, the container's port %v", eg.ProxyListen, ports)
	}
	if _, p, _ := net.SplitHostPort(eg.DNSListen); p != strconv.Itoa(int(ports["egress-dns/UDP"])) || ports["egress-dns/UDP"] != ports["egress-dns-tcp/"] || ports["egress-dns-tcp/"] == 0 {
		t.Errorf("DNS listens on %q, the container's ports %v", eg.DNSListen, ports)
	}
	if eg.DNSAddr.String() != "10.96.0.53" || len(eg.ProxyAddrs) != 1 || eg.ProxyAddrs[0].String() != "10.96.0.53" {
		t.Errorf("addresses %v %v, want the Service's", eg.ProxyAddrs, eg.DNSAddr)
	}
	if _, err := parse(""); err == nil || !strings.Contains(err.Error(), "--egress-proxy-addr") {
		t.Errorf("the variable unexpanded: %v, want --egress-proxy-addr refused", err)
	}
}
