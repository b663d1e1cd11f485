package runtime

import (
	"regexp"
	"sync"
)

// lazyRegexp is a regular expression compiled at its first use, not at package init:
// sandbox-agent links this package (as every sandbox's first process), and compiling the
// package's expressions at its start was about half of the agent's package
// initialisation (bench/ BenchmarkAgentStart), for expressions the agent never uses.
type lazyRegexp struct {
	expr string
	re   func() *regexp.Regexp
}

func newLazyRegexp(expr string) *lazyRegexp {
	return &lazyRegexp{expr: expr, re: sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })}
}

// MatchString reports whether s contains a match of the expression.
func (l *lazyRegexp) MatchString(s string) bool { return l.re().MatchString(s) }

// String is the expression's source text.
func (l *lazyRegexp) String() string { return l.expr }
