package main

import (
	"strings"
	"testing"
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
