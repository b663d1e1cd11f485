package agentconfig

import (
	"strings"
	"testing"
)

func TestMergeEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		base    []string
		overlay map[string]string
		want    string
	}{
		{"nothing", nil, nil, ""},
		{"base only", []string{"PATH=/bin", "A=1"}, nil, "PATH=/bin A=1"},
		{"override in place, new keys sorted", []string{"PATH=/bin", "A=1", "B=2"}, map[string]string{"B": "x", "C": "3", "AA": "4"}, "PATH=/bin A=1 B=x AA=4 C=3"},
		{"duplicate base key overridden once", []string{"A=1", "A=2"}, map[string]string{"A": "x"}, "A=x"},
		{"empty value kept", []string{"A=1"}, map[string]string{"A": ""}, "A="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(MergeEnv(tc.base, tc.overlay), " "); got != tc.want {
				t.Errorf("MergeEnv = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestTakeEnvFromProcess: named variables come from the process environment, overriding
// the file's; a name the process lacks is left out.
func TestTakeEnvFromProcess(t *testing.T) {
	c := &Config{Env: []string{"PATH=/bin", "TOKEN=stale"}, EnvFromProcess: []string{"TOKEN", "MISSING", "NEW"}}
	c.TakeEnvFromProcess(func(k string) (string, bool) {
		v, ok := map[string]string{"TOKEN": "s3cret", "NEW": "n"}[k]
		return v, ok
	})
	if got := strings.Join(c.Env, " "); got != "PATH=/bin TOKEN=s3cret NEW=n" {
		t.Errorf("env %q", got)
	}
}
