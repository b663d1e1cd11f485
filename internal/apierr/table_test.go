package apierr

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
)

var update = flag.Bool("update", false, "rewrite the reason table in docs/api.md")

// reasonConsts returns the CWSANDBOX_* string constants declared in file, by name.
func reasonConsts(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				s, _ := strconv.Unquote(lit.Value)
				if strings.HasPrefix(s, "CWSANDBOX_") {
					out[vs.Names[i].Name] = s
				}
			}
		}
	}
	return out
}

// TestEveryReasonHasACode: every reason constant is in the table, exactly once, with a
// code; so are the reasons the Go SDK names (it maps them back to sentinel errors).
func TestEveryReasonHasACode(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range table {
		if seen[r.reason] {
			t.Errorf("%s is in the table twice", r.reason)
		}
		seen[r.reason] = true
		if r.code == 0 || r.code == connect.CodeUnknown {
			t.Errorf("%s has no code", r.reason)
		}
		if r.when == "" {
			t.Errorf("%s does not say when it is sent", r.reason)
		}
	}
	consts := reasonConsts(t, "apierr.go")
	if len(consts) == 0 {
		t.Fatal("found no reason constants in apierr.go")
	}
	for name, reason := range consts {
		if !seen[reason] {
			t.Errorf("%s (%s) has no code in the table", name, reason)
		}
	}
	if len(consts) != len(table) {
		t.Errorf("%d reason constants, %d table rows", len(consts), len(table))
	}
	for name, reason := range reasonConsts(t, "../../sdk/go/errors.go") {
		if !seen[reason] {
			t.Errorf("sdk/go %s (%s) is no reason of the server's table", name, reason)
		}
	}
}

func TestNewTakesTheCodeFromTheTable(t *testing.T) {
	for _, r := range table {
		if got := connect.CodeOf(New(r.reason, "m", nil)); got != r.code {
			t.Errorf("New(%s): code %v, want %v", r.reason, got, r.code)
		}
	}
	if got := Code("CWSANDBOX_NO_SUCH_REASON"); got != connect.CodeUnknown {
		t.Errorf("Code of an unknown reason: %v", got)
	}
}

const (
	docsFile  = "../../docs/api.md"
	docsBegin = "<!-- reason table: generated from internal/apierr (go test ./internal/apierr -update) -->\n"
	docsEnd   = "<!-- end of reason table -->\n"
)

// docsTable renders the table as the Markdown docs/api.md shows.
func docsTable() string {
	var b strings.Builder
	b.WriteString("| Reason | Code | Sent when |\n|---|---|---|\n")
	for _, r := range table {
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", r.reason, strings.ToUpper(r.code.String()), r.when)
	}
	return b.String()
}

// TestDocsTable: docs/api.md lists the table as it is.
func TestDocsTable(t *testing.T) {
	b, err := os.ReadFile(docsFile)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, docsBegin), strings.Index(doc, docsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no reason table between %q and %q", docsFile, docsBegin, docsEnd)
	}
	want := docsTable()
	if got := doc[i+len(docsBegin) : j]; got != want {
		if *update {
			if err := os.WriteFile(docsFile, []byte(doc[:i+len(docsBegin)]+want+doc[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("the reason table in %s is stale: run go test ./internal/apierr -update\nwant:\n%s", docsFile, want)
	}
}

// TestReasonsLiveHere: no server package spells a reason of its own; it names apierr's
// constant, whose code is in the table. (sdk/go is the client's mirror; tests may spell
// what they expect.)
func TestReasonsLiveHere(t *testing.T) {
	lit := regexp.MustCompile(`"CWSANDBOX_[A-Z0-9_]+"`)
	root := "../.."
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			switch rel {
			case "sdk", "internal/apierr", ".git", "gen", "tools":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAll(b, -1) {
			t.Errorf("%s spells the reason %s: declare it in internal/apierr with its code", rel, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
