package main

import (
	"strconv"
	"strings"
	"testing"
)

// TestExpandHelloAddr: $POD_IP expands in the host part only, so an IPv6 Pod IP gives a
// bracketed, parseable address; a host that is not an IP, a bad port or an unbracketed
// literal IPv6 address are refused.
func TestExpandHelloAddr(t *testing.T) {
	env := func(ip string) func(string) string {
		return func(k string) string {
			if k == "POD_IP" {
				return ip
			}
			return ""
		}
	}
	for _, tc := range []struct{ raw, ip, want string }{
		{"$POD_IP:7444", "10.244.0.5", "10.244.0.5:7444"},
		{"$POD_IP:7444", "fd00:10:244::5", "[fd00:10:244::5]:7444"},
		{"[$POD_IP]:7444", "fd00:10:244::5", "[fd00:10:244::5]:7444"},
		{"${POD_IP}:7444", "10.244.0.5", "10.244.0.5:7444"},
		{"[fd00::1]:7444", "", "[fd00::1]:7444"},
		{"192.0.2.1:7444", "", "192.0.2.1:7444"},
	} {
		got, err := expandHelloAddr(tc.raw, env(tc.ip))
		if err != nil || got != tc.want {
			t.Errorf("%q with POD_IP=%q: %q, %v; want %q", tc.raw, tc.ip, got, err, tc.want)
		}
	}
	// The errors say what is wrong (kubernetes.ParseHelloAddr's, under the flag's name).
	for raw, want := range map[string]string{
		"fd00::1:7444":        "want IP:port ([IPv6]:port",
		"10.0.0.1":            "want IP:port",
		"$POD_IP:7444":        `host "" is not an IP address`,
		"runner.example:7444": `host "runner.example" is not an IP address`,
		"[fe80::1%eth0]:7444": `host "fe80::1%eth0" has a zone`,
		"10.0.0.1:0":          `port "0": want 1..65535`,
		"10.0.0.1:65536":      `port "65536": want 1..65535`,
		"10.0.0.1:x":          `port "x": want 1..65535`,
	} {
		got, err := expandHelloAddr(raw, env(""))
		if err == nil || !strings.Contains(err.Error(), "--hello-addr "+strconv.Quote(raw)) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %q, %v; want an error saying %q", raw, got, err, want)
		}
	}
}
