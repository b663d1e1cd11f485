package sbxcli

import (
	"strings"
	"testing"
)

func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      string // a key path that must be present, "" for none
		err       string
	}{
		{"empty mapping", "{}", "", ""},
		{"json", `{"constraints":{"resources":{"max_cpu":"2"}}}`, "constraints", ""},
		{"yaml", "constraints:\n  resources:\n    max_cpu: \"2\"\n", "constraints", ""},
		{"yaml with comments", "# strict\nbase:\n  max_lifetime_seconds: 600 # ten minutes\n", "base", ""},
		{"a list", "- a\n- b\n", "", "must be a mapping"},
		{"a scalar", "42", "", "must be a mapping"},
		{"nothing", "", "", "must be a mapping"},
		{"broken yaml", "a: [1, 2\n", "", "policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parsePolicy("p.yaml", []byte(tc.doc))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != "" {
				if _, ok := p.GetFields()[tc.want]; !ok {
					t.Errorf("parsed %v lacks %q", p, tc.want)
				}
			}
		})
	}
}
