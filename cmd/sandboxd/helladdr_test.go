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
	for _, raw := range []string{"fd00::1:7444", "$POD_IP:7444", "runner.example:7444", "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1:x", "10.0.0.1", "[fe80::1%eth0]:7444"} {
		if got, err := expandHelloAddr(raw, env("")); err == nil || !strings.HasPrefix(err.Error(), "--hello-addr "+strconv.Quote(raw)+": ") {
			t.Errorf("%q: %q, %v; want an error naming the flag and its value", raw, got, err)
		}
	}
	// The expanded value is checked by the backend's one check (kubernetes.ParseHelloAddr,
	// whose errors its own test covers): its reason follows the flag's name.
	for ip, want := range map[string]string{"runner.example": `host "runner.example" is not an IP address`, "fe80::1%eth0": `host "fe80::1%eth0" has a zone`} {
		if got, err := expandHelloAddr("[$POD_IP]:7444", env(ip)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("POD_IP=%q: %q, %v; want an error saying %q", ip, got, err, want)
		}
	}
}
