package main

import "testing"

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
	for _, raw := range []string{"fd00::1:7444", "$POD_IP:7444", "runner.example:7444", "10.0.0.1:0", "10.0.0.1:x", "10.0.0.1", "[fe80::1%eth0]:7444"} {
		if got, err := expandHelloAddr(raw, env("")); err == nil {
			t.Errorf("%q: %q, want an error", raw, got)
		}
	}
}
