package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// mod is the module the rules speak of; its packages are named relative to it.
const mod = "github.com/sandboxd/sandboxd"

// A rule: no package matching from (but not except) reaches, through the non-test
// imports of the packages on the way, a package that forbids reports.
type rule struct {
	name, why    string
	from, except []string
	forbid       []string
	// only, if set, is the complete list of non-standard packages the rule's packages
	// may reach: any other is forbidden too.
	only []string
}

// A funcRule is a rule for the code paths of a main package, whose subcommands differ
// in what they may reach: from the functions named in roots (and from the package's
// initialisation, which runs for every subcommand), no reference reaches a forbidden
// package, directly or through the imports of the packages used.
type funcRule struct {
	name, why string
	pkg       string
	roots     []string
	forbid    []string
}

// allowed is a violation that exists today, with the issue-17 step that removes it.
type allowed struct {
	importer, imported string // a package (or pkg.func of a funcRule's root) and what it must not reach
	step               int
	why                string
}

// edge is an import (or a function's use of a package) by short names (short).
type edge struct{ from, to string }

type violation struct {
	edge
	path []string // from a root to edge.to
}

// pkg is a package as `go list -json` describes it.
type pkg struct {
	ImportPath, Name, Dir string
	GoFiles, CgoFiles     []string
	Imports               []string
	Standard, DepOnly     bool
	Error                 *struct{ Err string }
	DepsErrors            []*struct{ Err string }
}

// graph holds packages by import path.
type graph map[string]*pkg

// goList lists the packages matching patterns and all their dependencies, with env
// added to the go tool's environment. It skips the test when there is no go tool.
func goList(t testing.TB, env []string, patterns ...string) graph {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH: the dependency rules are read with `go list`")
	}
	args := append([]string{"list", "-e", "-deps", "-json=ImportPath,Name,Dir,GoFiles,CgoFiles,Imports,Standard,DepOnly,Error,DepsErrors"}, patterns...)
	cmd := exec.Command(goTool, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	g := graph{}
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		g[p.ImportPath] = &p
	}
	return g
}

// short names a package of the module relative to it, any other by its import path.
func short(path string) string { return strings.TrimPrefix(path, mod+"/") }

// abs is the import path (pattern) of a pattern as the rules write it: relative to the
// module unless its first element has a dot (k8s.io/..., github.com/...). Standard
// library packages cannot be named.
func abs(pattern string) string {
	if first, _, _ := strings.Cut(pattern, "/"); first != "..." && strings.Contains(first, ".") {
		return pattern
	}
	return mod + "/" + pattern
}

// matches reports whether path matches one of patterns; "x/..." matches x and
// everything below it.
func matches(patterns []string, path string) bool {
	for _, p := range patterns {
		p = abs(p)
		if base, ok := strings.CutSuffix(p, "/..."); ok {
			if path == base || strings.HasPrefix(path, base+"/") {
				return true
			}
		} else if path == p {
			return true
		}
	}
	return false
}

// modulePackages are the packages of the module matching from but not except, sorted.
func (g graph) modulePackages(from, except []string) []string {
	var out []string
	for path, p := range g {
		if !p.Standard && !p.DepOnly && matches(from, path) && !matches(except, path) {
			out = append(out, path)
		}
	}
	slices.Sort(out)
	return out
}

// forbids is the set of packages r forbids. The cgo pseudo-package "C" (of the
// standard library's net, os/user) is not one: TestAgentBuildsWithoutCgo covers cgo.
func (r rule) forbids(g graph) func(string) bool {
	return func(path string) bool {
		if matches(r.forbid, path) {
			return true
		}
		p := g[path]
		return len(r.only) > 0 && path != "C" && (p == nil || !p.Standard) && !matches(r.only, path)
	}
}

// reach walks the import graph from roots and returns each import of a walked package
// that bad reports, with a path that reaches it, unless skip (the allow-list) takes it.
// It never walks into a bad package.
func (g graph) reach(roots []string, bad func(string) bool, skip func(edge) bool) []violation {
	parent := map[string]string{}
	queue := slices.Clone(roots)
	for _, r := range roots {
		parent[r] = ""
	}
	seen := map[edge]bool{}
	var out []violation
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		p := g[n]
		if p == nil {
			continue
		}
		for _, m := range p.Imports {
			if bad(m) {
				e := edge{short(n), short(m)}
				if seen[e] || skip(e) {
					continue
				}
				seen[e] = true
				out = append(out, violation{e, append(g.pathTo(parent, n), short(m))})
				continue
			}
			if _, ok := parent[m]; !ok {
				parent[m] = n
				queue = append(queue, m)
			}
		}
	}
	return out
}

func (g graph) pathTo(parent map[string]string, n string) []string {
	var path []string
	for ; n != ""; n = parent[n] {
		path = append(path, short(n))
	}
	slices.Reverse(path)
	return path
}

// audit checks rules and funcRules against g with the allow-list and returns what is
// wrong: each violation not allowed, each allow-list entry no violation matches (it
// must be deleted), and each pattern or root that names nothing (a rule that checks
// nothing).
func audit(g graph, rules []rule, funcRules []funcRule, allow []allowed) []string {
	var problems []string
	listed, used := map[edge]bool{}, map[edge]bool{}
	for _, a := range allow {
		e := edge{a.importer, a.imported}
		if listed[e] {
			problems = append(problems, fmt.Sprintf("allow-list: %s → %s is listed twice", e.from, e.to))
		}
		if a.step < 2 || a.step > 7 || a.why == "" {
			problems = append(problems, fmt.Sprintf("allow-list: %s → %s must name the issue-17 step (2-7) that removes it, and what moves", e.from, e.to))
		}
		listed[e] = true
	}
	skip := func(e edge) bool {
		used[e] = used[e] || listed[e]
		return listed[e]
	}
	report := func(name, why string, vs []violation) {
		for _, v := range vs {
			problems = append(problems, fmt.Sprintf("%s: %s reaches %s (%s)\n\tpath: %s\n\tfix the import, or (for a step of issue 17 still to come) add {%q, %q, step, why} to the allow-list",
				name, v.from, v.to, why, strings.Join(v.path, " → "), v.from, v.to))
		}
	}
	for _, r := range rules {
		problems = append(problems, g.unmatched(r.name, r.from, r.except, r.forbid, r.only)...)
		report(r.name, r.why, g.reach(g.modulePackages(r.from, r.except), r.forbids(g), skip))
	}
	for _, r := range funcRules {
		problems = append(problems, g.unmatched(r.name, r.forbid)...)
		vs, err := g.funcReach(r, skip)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", r.name, err))
		}
		report(r.name, r.why, vs)
	}
	for _, a := range allow {
		if e := (edge{a.importer, a.imported}); !used[e] {
			problems = append(problems, fmt.Sprintf("allow-list: %s → %s (step %d) is no violation any more: delete its entry", e.from, e.to, a.step))
		}
	}
	return problems
}

// unmatched names each pattern of lists that matches no package of g: a renamed or
// mistyped package would otherwise make its rule check nothing.
func (g graph) unmatched(name string, lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, p := range l {
			found := false
			for path := range g {
				if found = matches([]string{p}, path); found {
					break
				}
			}
			if !found {
				out = append(out, fmt.Sprintf("%s: pattern %q matches no package", name, p))
			}
		}
	}
	return out
}

// funcReach checks a funcRule: from each root, and from the package's initialisation,
// it follows references between the package's declarations (funcs.refs) and reports
// each forbidden package reached, once per root.
func (g graph) funcReach(r funcRule, skip func(edge) bool) ([]violation, error) {
	p := g[abs(r.pkg)]
	if p == nil {
		return nil, fmt.Errorf("package %s not listed", r.pkg)
	}
	f, err := parseFuncs(g, p)
	if err != nil {
		return nil, err
	}
	bad := rule{forbid: r.forbid}.forbids(g)
	var out []violation
	for _, root := range append(slices.Clone(r.roots), "") {
		start, label := f.initialisers, short(p.ImportPath)+".(package initialisation)"
		if root != "" {
			obj := f.lookup(root)
			if obj == nil {
				return out, fmt.Errorf("root %s: no such function or method in %s", root, r.pkg)
			}
			start, label = []types.Object{obj}, short(p.ImportPath)+"."+root
		}
		reported := map[string]bool{}
		for _, u := range f.reach(start) {
			var found []violation
			if bad(u.path) {
				found = []violation{{edge{label, short(u.path)}, []string{short(u.path)}}}
			} else {
				found = g.reach([]string{u.path}, bad, skip)
			}
			for _, v := range found {
				e := edge{label, v.to}
				if reported[v.to] || skip(e) {
					continue
				}
				reported[v.to] = true
				via := slices.Clone(u.via)
				via[0] = short(p.ImportPath) + "." + via[0]
				out = append(out, violation{e, append(via, v.path...)})
			}
		}
	}
	return out, nil
}

// funcs is the reference graph of one package's declarations.
type funcs struct {
	pkg          *types.Package
	info         *types.Info
	decls        map[types.Object]ast.Node // what to walk for each declared object
	methods      map[string][]types.Object // by method name
	methodsOf    map[*types.TypeName][]types.Object
	initialisers []types.Object // init funcs and package-level variables with a value
}

// use is a package a declaration uses, and the declarations that lead to it.
type use struct {
	path string
	via  []string
}

// parseFuncs type-checks p's files against imports that are empty (named as go list
// says), so that identifiers resolve to the package's own declarations, its locals or
// its imports without loading any dependency. A selector the checker cannot resolve
// (on a value of an imported type) is taken to reach every method of that name in the
// package: the graph may hold too many edges, never too few.
func parseFuncs(g graph, p *pkg) (*funcs, error) {
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range append(slices.Clone(p.GoFiles), p.CgoFiles...) {
		file, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, file)
	}
	info := &types.Info{Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: emptyImporter(g), Error: func(error) {}, FakeImportC: true}
	tp, _ := conf.Check(p.ImportPath, fset, files, info) // errors: the imports are empty
	f := &funcs{pkg: tp, info: info, decls: map[types.Object]ast.Node{}, methods: map[string][]types.Object{}, methodsOf: map[*types.TypeName][]types.Object{}}
	for _, file := range files {
		for _, d := range file.Decls {
			f.declare(d)
		}
	}
	return f, nil
}

// lookup finds a function ("name") or method ("Type.name") declared in the package.
func (f *funcs) lookup(name string) *types.Func {
	typ, method, isMethod := strings.Cut(name, ".")
	if !isMethod {
		fn, _ := f.pkg.Scope().Lookup(name).(*types.Func)
		return fn
	}
	tn, _ := f.pkg.Scope().Lookup(typ).(*types.TypeName)
	if tn == nil {
		return nil
	}
	for _, m := range f.methodsOf[tn] {
		if m.Name() == method {
			return m.(*types.Func)
		}
	}
	return nil
}

func (f *funcs) declare(d ast.Decl) {
	switch d := d.(type) {
	case *ast.FuncDecl:
		obj := f.info.Defs[d.Name]
		if obj == nil {
			return
		}
		f.decls[obj] = d
		if d.Recv == nil {
			if d.Name.Name == "init" {
				f.initialisers = append(f.initialisers, obj)
			}
			return
		}
		f.methods[d.Name.Name] = append(f.methods[d.Name.Name], obj)
		if tn := receiverType(obj); tn != nil {
			f.methodsOf[tn] = append(f.methodsOf[tn], obj)
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				if obj := f.info.Defs[s.Name]; obj != nil {
					f.decls[obj] = s
				}
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if obj := f.info.Defs[n]; obj != nil {
						f.decls[obj] = s
						if _, isVar := obj.(*types.Var); isVar && len(s.Values) > 0 {
							f.initialisers = append(f.initialisers, obj)
						}
					}
				}
			}
		}
	}
}

func receiverType(m types.Object) *types.TypeName {
	sig, _ := m.Type().(*types.Signature)
	if sig == nil || sig.Recv() == nil {
		return nil
	}
	t := sig.Recv().Type()
	if ptr, ok := t.(*types.Pointer); ok {
		t = ptr.Elem()
	}
	if n, ok := t.(*types.Named); ok {
		return n.Obj()
	}
	return nil
}

// refs are the package's declarations that obj's declaration refers to, and the import
// paths it uses. A type refers to its methods: any value of it may have them called
// through an interface.
func (f *funcs) refs(obj types.Object) (decls []types.Object, imports []string) {
	if tn, ok := obj.(*types.TypeName); ok {
		decls = append(decls, f.methodsOf[tn]...)
	}
	if d := f.decls[obj]; d != nil {
		ast.Inspect(d, func(n ast.Node) bool {
			decls, imports = f.ref(n, decls, imports)
			return true
		})
	}
	return decls, imports
}

func (f *funcs) ref(n ast.Node, decls []types.Object, imports []string) ([]types.Object, []string) {
	switch n := n.(type) {
	case *ast.SelectorExpr:
		if id, ok := n.X.(*ast.Ident); ok {
			if _, isPkg := f.info.Uses[id].(*types.PkgName); isPkg {
				break // pkg.Name: the package is the reference
			}
		}
		if _, resolved := f.info.Uses[n.Sel]; !resolved {
			decls = append(decls, f.methods[n.Sel.Name]...)
		}
	case *ast.Ident:
		switch obj := f.info.Uses[n].(type) {
		case nil:
		case *types.PkgName:
			imports = append(imports, obj.Imported().Path())
		default:
			if obj.Pkg() == f.pkg && f.decls[obj] != nil {
				decls = append(decls, obj)
			}
		}
	}
	return decls, imports
}

// reach walks the references from start and returns each import path used, first
// found, with the declarations that lead to it.
func (f *funcs) reach(start []types.Object) []use {
	parent := map[types.Object]types.Object{}
	var queue []types.Object
	for _, o := range start {
		if _, ok := parent[o]; !ok {
			parent[o] = nil
			queue = append(queue, o)
		}
	}
	seen := map[string]bool{}
	var out []use
	for len(queue) > 0 {
		o := queue[0]
		queue = queue[1:]
		decls, imports := f.refs(o)
		for _, path := range imports {
			if !seen[path] {
				seen[path] = true
				out = append(out, use{path, f.chain(parent, o)})
			}
		}
		for _, d := range decls {
			if _, ok := parent[d]; !ok {
				parent[d] = o
				queue = append(queue, d)
			}
		}
	}
	return out
}

// chain names the declarations from a start to o.
func (f *funcs) chain(parent map[types.Object]types.Object, o types.Object) []string {
	var names []string
	for ; o != nil; o = parent[o] {
		name := o.Name()
		if tn := receiverType(o); tn != nil {
			name = tn.Name() + "." + name
		}
		names = append(names, name)
	}
	slices.Reverse(names)
	return names
}

// emptyImporter imports every package as an empty, complete package of the name go
// list gives it.
func emptyImporter(g graph) types.ImporterFrom { return importer{g, map[string]*types.Package{}} }

type importer struct {
	g     graph
	cache map[string]*types.Package
}

func (i importer) Import(path string) (*types.Package, error) { return i.ImportFrom(path, "", 0) }

func (i importer) ImportFrom(path, _ string, _ types.ImportMode) (*types.Package, error) {
	if p, ok := i.cache[path]; ok {
		return p, nil
	}
	name := path[strings.LastIndex(path, "/")+1:]
	if p := i.g[path]; p != nil && p.Name != "" {
		name = p.Name
	}
	tp := types.NewPackage(path, name)
	tp.MarkComplete()
	i.cache[path] = tp
	return tp, nil
}
