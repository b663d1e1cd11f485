package main

import (
	"flag"
	"slices"
	"strings"
	"testing"
)

func TestNodeAgentFlags(t *testing.T) {
	parse := func(args ...string) (*nodeAgentConfig, error) {
		var c nodeAgentConfig
		fs := flag.NewFlagSet("node-agent", flag.ContinueOnError)
		c.bind(fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &c, c.validate()
	}
	c, err := parse("--node", "n1", "--runner-id", "runner-a", "--namespace", "sbx", "--namespace", "b,c")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.namespaceList(); !slices.Equal(got, []string{"sbx", "b", "c"}) {
		t.Fatalf("namespaces %v", got)
	}
	if c.listen != ":7445" || c.runtimeHandler != "runsc" || c.quotaBytes != 20<<30 || c.minFreeBytes != 2<<30 {
		t.Fatalf("defaults %+v", c)
	}
	for _, bad := range [][]string{
		{"--runner-id", "runner-a", "--namespace", "sbx"},            // no node
		{"--node", "n1", "--namespace", "sbx"},                       // no runner
		{"--node", "n1", "--runner-id", "a/b", "--namespace", "sbx"}, // bad runner
		{"--node", "n1", "--runner-id", "r"},                         // no namespace
		{"--node", "n1", "--runner-id", "r", "--namespace", "s", "--checkpoint-root", "rel"},
		{"--node", "n1", "--runner-id", "r", "--namespace", "s", "--state-dir", "/a/../b"},
		{"--node", "n1", "--runner-id", "r", "--namespace", "s", "--quota-bytes", "0"},
		{"--node", "n1", "--runner-id", "r", "--namespace", "s", "--min-free-bytes", "-1"},
		{"--node", "n1", "--runner-id", "r", "--namespace", "s", "--gc-interval", "1s"},
	} {
		t.Setenv("NODE_NAME", "")
		if _, err := parse(bad...); err == nil {
			t.Errorf("%s accepted", strings.Join(bad, " "))
		}
	}
}
