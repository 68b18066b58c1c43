// Package reasonscan finds, by reading the source (go/parser, no type
// checking), every error reason the module's non-test Go code can use: the
// reason argument of each internal/apierror constructor, of each function
// that passes one of its parameters on as such an argument, the values
// compared with a read reason, and every constant whose name says it is a
// reason or an error code. The catalogue test uses it so that a reason
// cannot be invented inline.
package reasonscan

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Use is one place where a reason is used.
type Use struct {
	// Reason is the reason's string value.
	Reason string
	// Pos is file:line, relative to the scanned root.
	Pos string
	// How says what kind of use it is: "call F" (the argument of F),
	// "const NAME" (a declaration) or "compare".
	How string
	// Code is the gRPC code it is returned with when the call says so
	// (apierror.New(codes.X, …), InvalidArgument, Unavailable, Store),
	// in google.rpc.Code form (INVALID_ARGUMENT); "" otherwise.
	Code string
}

// Dynamic is a reason argument whose value the scan cannot know (a
// variable or a field): it is reported so a reviewer can follow it.
type Dynamic struct {
	// Pos is file:line, relative to the scanned root.
	Pos string
	// Call is the callee.
	Call string
	// Expr is the argument's source text.
	Expr string
}

// Result is what Scan found.
type Result struct {
	// Uses are the reasons with a known value, in file order.
	Uses []Use
	// Dynamic are the reason arguments of unknown value.
	Dynamic []Dynamic
}

// apierrorPath is the import path of the package whose constructors take
// a reason.
const apierrorPath = "/internal/apierror"

// seeds are the apierror functions that take (or compare with) a reason,
// with the index of that argument.
var seeds = map[string]int{"New": 1, "InvalidArgument": 0, "Unavailable": 0, "Store": 0, "WithMetadata": 1, "Is": 2}

// reasonConst matches the names of constants that hold a reason or an
// error code: reasonX, ReasonX, codeX, CodeX.
var reasonConst = regexp.MustCompile(`^(reason|Reason|code|Code)([A-Z0-9_]|$)`)

// pkg is one directory's parsed non-test files.
type pkg struct {
	path  string // import path
	files []*ast.File
}

// scanner holds the parsed module.
type scanner struct {
	root, module string
	fset         *token.FileSet
	pkgs         map[string]*pkg // by import path
	// consts maps "importpath.Name" to its value expression and file.
	consts map[string]constDecl
	// sinks maps "importpath.func" (methods by name) to the indexes of
	// its reason arguments.
	sinks map[string]map[int]bool
	// skip lists import paths whose reason-named constants are not error
	// reasons (e.g. Kubernetes condition reasons).
	skip map[string]bool
	// tests says whether _test.go files are read.
	tests bool
}

type constDecl struct {
	expr ast.Expr
	file *ast.File
	pkg  string
}

// Options say what Scan reads.
type Options struct {
	// Root is the module's root directory and Module its module path.
	Root, Module string
	// SkipConstPkgs are import paths scanned for calls but not for
	// reason-named constants (e.g. the operator's Kubernetes condition
	// reasons, which are not error reasons).
	SkipConstPkgs []string
	// Tests includes _test.go files.
	Tests bool
}

// Scan reads every non-generated Go file under o.Root (with the test
// files when o.Tests is set).
func Scan(o Options) (*Result, error) {
	root, module := o.Root, o.Module
	s := &scanner{root: root, module: module, fset: token.NewFileSet(), pkgs: map[string]*pkg{},
		consts: map[string]constDecl{}, sinks: map[string]map[int]bool{}, skip: map[string]bool{}, tests: o.Tests}
	for _, p := range o.SkipConstPkgs {
		s.skip[p] = true
	}
	for name, i := range seeds {
		s.sinks[module+apierrorPath+"."+name] = map[int]bool{i: true}
	}
	if err := s.parse(); err != nil {
		return nil, err
	}
	s.propagate()
	return s.collect(), nil
}

func (s *scanner) parse() error {
	return filepath.WalkDir(s.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != s.root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			if path != s.root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || (!s.tests && strings.HasSuffix(name, "_test.go")) || strings.HasSuffix(name, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(s.fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(s.root, filepath.Dir(path))
		ip := s.module
		if rel != "." {
			ip += "/" + filepath.ToSlash(rel)
		}
		p := s.pkgs[ip]
		if p == nil {
			p = &pkg{path: ip}
			s.pkgs[ip] = p
		}
		p.files = append(p.files, f)
		ast.Inspect(f, func(n ast.Node) bool {
			gd, ok := n.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				return true
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if i < len(vs.Values) {
						s.consts[ip+"."+id.Name] = constDecl{expr: vs.Values[i], file: f, pkg: ip}
					}
				}
			}
			return true
		})
		return nil
	})
}

// imports returns the file's import names mapped to import paths.
func imports(f *ast.File) map[string]string {
	m := map[string]string{}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		m[name] = p
	}
	return m
}

// callee names the function a call calls: "importpath.Name" for a
// package-level function of this or an imported package, and
// "importpath.Method" for a method call (assumed to be of this package).
func callee(call *ast.CallExpr, pkgPath string, imps map[string]string) string {
	switch fn := call.Fun.(type) {
	case *ast.Ident:
		return pkgPath + "." + fn.Name
	case *ast.SelectorExpr:
		if x, ok := fn.X.(*ast.Ident); ok {
			if ip, ok := imps[x.Name]; ok {
				return ip + "." + fn.Sel.Name
			}
		}
		return pkgPath + "." + fn.Sel.Name
	case *ast.IndexExpr: // a generic function instantiated explicitly
		return callee(&ast.CallExpr{Fun: fn.X}, pkgPath, imps)
	}
	return ""
}

// funcKey names a declared function or method as callee does.
func funcKey(pkgPath string, fd *ast.FuncDecl) string { return pkgPath + "." + fd.Name.Name }

// params maps a function's parameter names to their indexes.
func params(ft *ast.FuncType) map[string]int {
	m := map[string]int{}
	i := 0
	for _, fl := range ft.Params.List {
		if len(fl.Names) == 0 {
			i++
			continue
		}
		for _, n := range fl.Names {
			m[n.Name] = i
			i++
		}
	}
	return m
}

// propagate marks, until nothing changes, every function that passes one
// of its parameters on as a reason argument.
func (s *scanner) propagate() {
	for changed := true; changed; {
		changed = false
		for _, p := range s.pkgs {
			for _, f := range p.files {
				imps := imports(f)
				for _, d := range f.Decls {
					fd, ok := d.(*ast.FuncDecl)
					if !ok || fd.Body == nil {
						continue
					}
					ps := params(fd.Type)
					key := funcKey(p.path, fd)
					mark := func(e ast.Expr) {
						id, ok := e.(*ast.Ident)
						if !ok {
							return
						}
						if pi, ok := ps[id.Name]; ok && !s.sinks[key][pi] {
							if s.sinks[key] == nil {
								s.sinks[key] = map[int]bool{}
							}
							s.sinks[key][pi] = true
							changed = true
						}
					}
					ast.Inspect(fd.Body, func(n ast.Node) bool {
						if cl, ok := n.(*ast.CompositeLit); ok {
							for _, v := range reasonFields(cl) {
								mark(v)
							}
							return true
						}
						call, ok := n.(*ast.CallExpr)
						if !ok {
							return true
						}
						for i := range s.sinks[callee(call, p.path, imps)] {
							if i >= len(call.Args) {
								continue
							}
							id, ok := call.Args[i].(*ast.Ident)
							if !ok {
								continue
							}
							if pi, ok := ps[id.Name]; ok && !s.sinks[key][pi] {
								if s.sinks[key] == nil {
									s.sinks[key] = map[int]bool{}
								}
								s.sinks[key][pi] = true
								changed = true
							}
						}
						return true
					})
				}
			}
		}
	}
}

// value returns the string value of a constant expression, following
// constants of this and other packages of the module.
func (s *scanner) value(e ast.Expr, pkgPath string, imps map[string]string, depth int) (string, bool) {
	if depth > 10 {
		return "", false
	}
	switch x := e.(type) {
	case *ast.BasicLit:
		if x.Kind != token.STRING {
			return "", false
		}
		v, err := strconv.Unquote(x.Value)
		return v, err == nil
	case *ast.ParenExpr:
		return s.value(x.X, pkgPath, imps, depth+1)
	case *ast.Ident:
		if c, ok := s.consts[pkgPath+"."+x.Name]; ok {
			return s.value(c.expr, c.pkg, imports(c.file), depth+1)
		}
	case *ast.SelectorExpr:
		if id, ok := x.X.(*ast.Ident); ok {
			if ip, ok := imps[id.Name]; ok {
				if c, ok := s.consts[ip+"."+x.Sel.Name]; ok {
					return s.value(c.expr, c.pkg, imports(c.file), depth+1)
				}
			}
		}
	case *ast.BinaryExpr:
		if x.Op == token.ADD {
			a, ok1 := s.value(x.X, pkgPath, imps, depth+1)
			b, ok2 := s.value(x.Y, pkgPath, imps, depth+1)
			return a + b, ok1 && ok2
		}
	case *ast.CallExpr: // a conversion, Reason("X")
		if len(x.Args) == 1 {
			return s.value(x.Args[0], pkgPath, imps, depth+1)
		}
	}
	return "", false
}

// fixedCodes are the codes of the apierror constructors that choose it.
var fixedCodes = map[string]string{"InvalidArgument": "INVALID_ARGUMENT", "Unavailable": "UNAVAILABLE", "Store": "INTERNAL"}

// upperSnake turns a codes constant's name (FailedPrecondition) into
// its google.rpc.Code name (FAILED_PRECONDITION).
func upperSnake(name string) string {
	if name == "Canceled" {
		return "CANCELLED"
	}
	var b strings.Builder
	for i, r := range name {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// code returns the gRPC code an apierror constructor call returns its
// reason with, when the call says: "" for other callees or a code not
// written as codes.X.
func (s *scanner) code(callee string, call *ast.CallExpr, imps map[string]string) string {
	fn, ok := strings.CutPrefix(callee, s.module+apierrorPath+".")
	if !ok {
		return ""
	}
	if c, ok := fixedCodes[fn]; ok {
		return c
	}
	if fn != "New" || len(call.Args) == 0 {
		return ""
	}
	if sel, ok := call.Args[0].(*ast.SelectorExpr); ok {
		if id, ok := sel.X.(*ast.Ident); ok && imps[id.Name] == "google.golang.org/grpc/codes" {
			return upperSnake(sel.Sel.Name)
		}
	}
	return ""
}

// readsReason reports whether e reads a reason: apierror.Reason(err) or
// x.GetReason().
func (s *scanner) readsReason(e ast.Expr, imps map[string]string) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	if sel.Sel.Name == "GetReason" {
		return true
	}
	if id, ok := sel.X.(*ast.Ident); ok && sel.Sel.Name == "Reason" && imps[id.Name] == s.module+apierrorPath {
		return true
	}
	return false
}

func (s *scanner) collect() *Result {
	r := &Result{}
	pos := func(p token.Pos) string {
		at := s.fset.Position(p)
		rel, _ := filepath.Rel(s.root, at.Filename)
		return fmt.Sprintf("%s:%d", filepath.ToSlash(rel), at.Line)
	}
	paths := make([]string, 0, len(s.pkgs))
	for ip := range s.pkgs {
		paths = append(paths, ip)
	}
	slices.Sort(paths)
	for _, ip := range paths {
		p := s.pkgs[ip]
		for _, f := range p.files {
			imps := imports(f)
			// ps is the parameters of the function being walked.
			var ps map[string]int
			var visit func(n ast.Node) bool
			visit = func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.FuncDecl:
					if x.Body != nil {
						ps = params(x.Type)
						ast.Inspect(x.Body, visit)
						ps = nil
					}
					return false
				case *ast.GenDecl:
					if x.Tok != token.CONST || s.skip[ip] {
						return true
					}
					for _, spec := range x.Specs {
						vs := spec.(*ast.ValueSpec)
						for i, id := range vs.Names {
							if i >= len(vs.Values) || !reasonConst.MatchString(id.Name) {
								continue
							}
							if v, ok := s.value(vs.Values[i], ip, imps, 0); ok {
								r.Uses = append(r.Uses, Use{Reason: v, Pos: pos(id.Pos()), How: "const " + id.Name})
							}
						}
					}
				case *ast.CallExpr:
					name := callee(x, ip, imps)
					for i := range s.sinks[name] {
						if i >= len(x.Args) {
							continue
						}
						a := x.Args[i]
						if v, ok := s.value(a, ip, imps, 0); ok {
							if v != "" { // "": no reason (WithMetadata's, a wrapper's default)
								r.Uses = append(r.Uses, Use{Reason: v, Pos: pos(a.Pos()), How: "call " + strings.TrimPrefix(name, s.module+"/"), Code: s.code(name, x, imps)})
							}
							continue
						}
						if id, ok := a.(*ast.Ident); ok {
							if _, isParam := ps[id.Name]; isParam {
								continue
							}
						}
						r.Dynamic = append(r.Dynamic, Dynamic{Pos: pos(a.Pos()), Call: strings.TrimPrefix(name, s.module+"/"), Expr: source(s.fset, a)})
					}
				case *ast.BinaryExpr:
					if x.Op != token.EQL && x.Op != token.NEQ {
						return true
					}
					for _, pair := range [][2]ast.Expr{{x.X, x.Y}, {x.Y, x.X}} {
						if s.readsReason(pair[0], imps) {
							if v, ok := s.value(pair[1], ip, imps, 0); ok && v != "" {
								r.Uses = append(r.Uses, Use{Reason: v, Pos: pos(pair[1].Pos()), How: "compare"})
							}
						}
					}
				case *ast.SwitchStmt:
					if x.Tag == nil || !s.readsReason(x.Tag, imps) {
						return true
					}
					for _, st := range x.Body.List {
						for _, e := range st.(*ast.CaseClause).List {
							if v, ok := s.value(e, ip, imps, 0); ok && v != "" {
								r.Uses = append(r.Uses, Use{Reason: v, Pos: pos(e.Pos()), How: "compare"})
							}
						}
					}
				case *ast.CompositeLit:
					for _, e := range reasonFields(x) {
						if v, ok := s.value(e, ip, imps, 0); ok && v != "" {
							r.Uses = append(r.Uses, Use{Reason: v, Pos: pos(e.Pos()), How: "field of " + source(s.fset, x.Type)})
						}
					}
				}
				return true
			}
			ast.Inspect(f, visit)
		}
	}
	return r
}

// reasonFields returns the values a composite literal gives a reason: the
// Reason of an ErrorInfo, the Reason, reason or Code of a type named
// *Error (identity.AuthError, grant.Error, adapter.DirectCallError), and
// any SafeCode (an attempt's error evidence).
func reasonFields(cl *ast.CompositeLit) []ast.Expr {
	var typ string
	switch t := cl.Type.(type) {
	case *ast.Ident:
		typ = t.Name
	case *ast.SelectorExpr:
		typ = t.Sel.Name
	default:
		return nil
	}
	var out []ast.Expr
	for _, el := range cl.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		k, ok := kv.Key.(*ast.Ident)
		if !ok {
			continue
		}
		switch {
		case k.Name == "SafeCode",
			typ == "ErrorInfo" && k.Name == "Reason",
			strings.HasSuffix(typ, "Error") && (k.Name == "Reason" || k.Name == "reason" || k.Name == "Code"):
			out = append(out, kv.Value)
		}
	}
	return out
}

// source returns e's text as written (approximately: identifiers and
// selectors; anything else by its type).
func source(fset *token.FileSet, e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return source(fset, x.X) + "." + x.Sel.Name
	case *ast.CallExpr:
		return source(fset, x.Fun) + "(…)"
	case *ast.IndexExpr:
		return source(fset, x.X) + "[…]"
	}
	return fmt.Sprintf("%T", e)
}
