package archtest

import (
	"path/filepath"
	"strings"
	"testing"
)

// synthetic builds a graph from "importer: imported ..." lines of module-relative
// names; names without a slash are standard library packages.
func synthetic(lines ...string) graph {
	g := graph{}
	add := func(name string) *pkg {
		path := name
		if strings.Contains(name, "/") {
			path = abs(name)
		}
		if g[path] == nil {
			g[path] = &pkg{ImportPath: path, Name: path[strings.LastIndex(path, "/")+1:], Standard: !strings.Contains(name, "/")}
		}
		return g[path]
	}
	for _, l := range lines {
		from, to, _ := strings.Cut(l, ":")
		p := add(strings.TrimSpace(from))
		for _, t := range strings.Fields(to) {
			p.Imports = append(p.Imports, add(t).ImportPath)
		}
	}
	return g
}

// wantProblems fails unless problems are exactly one per want, each containing it.
func wantProblems(t *testing.T, problems []string, want ...string) {
	t.Helper()
	left := append([]string(nil), problems...)
	for _, w := range want {
		found := false
		for i, p := range left {
			if strings.Contains(p, w) {
				left = append(left[:i], left[i+1:]...)
				found = true
				break
			}
		}
		if !found {
			t.Errorf("no problem contains %q", w)
		}
	}
	for _, p := range left {
		t.Errorf("unexpected problem: %s", p)
	}
}

// TestRuleCatchesNewViolation: a new import that breaks a rule fails (with the path
// that reaches it), one on the allow-list does not, and an entry that matches no
// violation any more fails too, so the list only shrinks.
func TestRuleCatchesNewViolation(t *testing.T) {
	g := synthetic(
		"internal/runner: fmt internal/helper",
		"internal/helper: internal/gateway",
		"internal/runnerapi: internal/gateway internal/gateway/placement",
		"internal/dataplane: fmt",
		"internal/gateway: internal/store",
		"internal/gateway/placement: fmt",
		"internal/store: fmt",
	)
	r := rule{name: "runner side never imports the gateway", from: []string{"internal/runner", "internal/runnerapi", "internal/dataplane"}, forbid: []string{"internal/gateway/..."}}

	wantProblems(t, audit(g, []rule{r}, nil, []allowed{
		{"internal/runnerapi", "internal/gateway", 2, "moves"},
		{"internal/runnerapi", "internal/gateway/placement", 2, "moves"},
	}), "internal/helper reaches internal/gateway (")
	if p := audit(g, []rule{r}, nil, nil); len(p) == 0 || !strings.Contains(strings.Join(p, "\n"), "path: internal/runner → internal/helper → internal/gateway\n") {
		t.Errorf("the report does not give the path that reaches the gateway: %q", p)
	}

	// The allow-list takes today's violations; a fixed one must leave it.
	wantProblems(t, audit(g, []rule{r}, nil, []allowed{
		{"internal/helper", "internal/gateway", 2, "moves"},
		{"internal/runnerapi", "internal/gateway", 2, "moves"},
		{"internal/runnerapi", "internal/gateway/placement", 2, "moves"},
		{"internal/dataplane", "internal/gateway", 2, "moves"},
	}), "internal/dataplane → internal/gateway (step 2) is no violation any more: delete its entry")

	// An entry must say which step removes it; a pattern must name a package.
	r.from = append(r.from, "internal/runer")
	wantProblems(t, audit(g, []rule{r}, nil, []allowed{
		{"internal/helper", "internal/gateway", 0, ""},
		{"internal/runnerapi", "internal/gateway", 2, "moves"},
		{"internal/runnerapi", "internal/gateway/placement", 2, "moves"},
	}), "internal/helper → internal/gateway must name the issue-17 step", `pattern "internal/runer" matches no package`)
}

// TestOnlyRule: with only set, every non-standard package reached must be listed.
func TestOnlyRule(t *testing.T) {
	g := synthetic(
		"cmd/sandbox-agent: fmt internal/agent",
		"internal/agent: os internal/apierr example.com/new",
		"internal/apierr: fmt",
		"example.com/new: net",
	)
	r := rule{name: "agent", from: []string{"cmd/sandbox-agent"}, only: []string{"internal/agent", "internal/apierr"}}
	wantProblems(t, audit(g, []rule{r}, nil, nil), "internal/agent reaches example.com/new")
}

// TestFuncRule: in a main package, a root reaches a forbidden package through its
// functions, the methods of the types it uses (also through an interface) and the
// imports of the packages it uses; a local that shadows a function is no reference;
// functions that are no root (dev) are not checked; package initialisation is.
func TestFuncRule(t *testing.T) {
	g := synthetic(
		"cmd/x: fmt internal/stack internal/testimage",
		"cmd/y: internal/testimage",
		"internal/stack: internal/testenv",
		"internal/testenv: internal/testimage",
	)
	g[abs("cmd/x")].Dir, g[abs("cmd/x")].GoFiles = filepath.Join("testdata", "mainpkg"), []string{"main.go", "other.go"}
	g[abs("cmd/y")].Dir, g[abs("cmd/y")].GoFiles = filepath.Join("testdata", "initpkg"), []string{"main.go"}
	forbid := []string{"internal/testimage", "internal/testenv"}
	r := funcRule{name: "dev only", pkg: "cmd/x", roots: []string{"runnerCmd", "gatewayCmd", "controlPlaneCmd", "apikey"}, forbid: forbid}

	wantProblems(t, audit(g, nil, []funcRule{r}, nil),
		"path: cmd/x.runnerCmd → mirror.start → serve → internal/testimage",
		"path: cmd/x.gatewayCmd → internal/stack → internal/testenv",
		"path: cmd/x.apikey → handler → handler.ServeHTTP → serve → internal/testimage")

	wantProblems(t, audit(g, nil, []funcRule{r}, []allowed{
		{"cmd/x.runnerCmd", "internal/testimage", 4, "moves"},
		{"cmd/x.gatewayCmd", "internal/testenv", 4, "moves"},
		{"cmd/x.apikey", "internal/testimage", 4, "moves"},
		{"cmd/x.controlPlaneCmd", "internal/testimage", 4, "moves"},
	}), "cmd/x.controlPlaneCmd → internal/testimage (step 4) is no violation any more")

	// Package initialisation runs for every subcommand.
	wantProblems(t, audit(g, nil, []funcRule{{name: "dev only", pkg: "cmd/y", roots: []string{"runnerCmd"}, forbid: forbid}}, nil),
		"path: cmd/y.hook → serve → internal/testimage")

	// A renamed root fails rather than checking nothing.
	r.roots = []string{"runner"}
	wantProblems(t, audit(g, nil, []funcRule{r}, nil), "root runner: no such function or method in cmd/x")
}

// TestNodeAgentRule: the node agent's rule as declared (rules) refuses an import of the
// gateway, the console, the control plane or the store from any package of the agent,
// directly or through a helper; the agent's own store (internal/nodeagent/store) and
// internal/runtime stay allowed.
func TestNodeAgentRule(t *testing.T) {
	var r *rule
	for i := range rules {
		if rules[i].name == nodeAgentRule {
			r = &rules[i]
		}
	}
	if r == nil {
		t.Fatalf("no rule %q", nodeAgentRule)
	}
	// Every package the rule forbids exists (a pattern that matches none is a problem).
	var forbidden []string
	for _, f := range r.forbid {
		forbidden = append(forbidden, strings.TrimSuffix(f, "/...")+": fmt")
	}
	g := synthetic(append(forbidden,
		"internal/nodeagent: fmt internal/nodeagent/store internal/runtime internal/gateway",
		"internal/nodeagent/cri: internal/console",
		"internal/nodeagent/hibernate: internal/helper",
		"internal/helper: internal/controlplane",
		"internal/nodeagent/store: internal/store",
		"internal/runtime: fmt",
	)...)
	wantProblems(t, audit(g, []rule{*r}, nil, nil),
		"internal/nodeagent reaches internal/gateway (",
		"internal/nodeagent/cri reaches internal/console (",
		"internal/helper reaches internal/controlplane (",
		"internal/nodeagent/store reaches internal/store (")
	clean := synthetic(append(forbidden,
		"internal/nodeagent: fmt internal/nodeagent/store internal/runtime",
		"internal/nodeagent/store: fmt",
		"internal/runtime: fmt",
	)...)
	wantProblems(t, audit(clean, []rule{*r}, nil, nil))
}
