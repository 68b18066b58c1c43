// Package layout holds the module's layering rule, as data: every package
// sits on a floor and imports only what lies below it or within its own
// unit, so the dependency graph cannot quietly grow upward (a service
// importing a fixture, a shared library importing a service).
package layout

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// module is the module path every package name below is relative to.
const module = "github.com/v0m3/v0m3"

// unit is one row of the layering table: the packages under prefix (the
// longest matching prefix wins), the floor they sit on, and the units on
// their own floor or above that they may import besides their own.
type unit struct {
	prefix string
	floor  int
	also   []string
	why    string
}

// units is the layering rule. A package imports (outside its tests) only
// packages of a lower floor, of its own unit, or of a unit in also.
var units = []unit{
	// Floor 0: contracts and shared libraries any package may use.
	{prefix: "proto", floor: 0, why: "API contracts (protobuf) and their generated code"},
	{prefix: "operator/api", floor: 0, why: "the Kubernetes resource contracts (MCPServer, Capability, TaskProfile)"},
	{prefix: "internal", floor: 0, also: []string{"proto"}, why: "shared libraries: identity, stores, telemetry, test kits"},

	// Floor 1: the five services, each its own unit (they reach each
	// other over gRPC, never by import), and the fixture servers: leaves
	// standing in for third-party MCP servers, which no service imports.
	{prefix: "services/adapter", floor: 1, why: "the adapter service"},
	{prefix: "services/evidence", floor: 1, why: "the evidence service"},
	{prefix: "services/orchestrator", floor: 1, why: "the orchestrator service"},
	{prefix: "services/policy", floor: 1, why: "the policy service"},
	{prefix: "services/registry", floor: 1, why: "the registry service"},
	{prefix: "demo/fixture", floor: 1, why: "fixture MCP servers (and their commands): leaves, imported by tests and the commands only"},

	// Floor 2: composition, what joins services (and, by registration,
	// fixtures) into a system.
	{prefix: "suite", floor: 2, why: "the composition root: the table of services"},
	{prefix: "demo/fixture/fixturedirect", floor: 2, why: "the fixture library as a direct adapter, registered by a composition root"},

	// Floor 3: programs.
	{prefix: "cmd", floor: 3, also: []string{"demo", "operator", "charts"}, why: "the one binary"},
	{prefix: "demo", floor: 3, why: "the demo scenario and the load generator"},
	{prefix: "operator", floor: 3, why: "the Kubernetes operator and the stdio bridge"},
	{prefix: "charts", floor: 3, why: "the Helm chart (its files, embedded)"},
	{prefix: "examples", floor: 3, why: "agents a reader runs against a task (MCP clients of its endpoint)"},

	// Floor 4: suites that only test.
	{prefix: "test", floor: 4, why: "end-to-end, attack, fault, conformance and real-node suites"},
}

// theServices are the only directories services/ may hold.
var theServices = []string{"adapter", "evidence", "orchestrator", "policy", "registry"}

// unitOf returns the row whose prefix matches pkg (relative to the
// module) longest.
func unitOf(pkg string) (unit, bool) {
	var best unit
	found := false
	for _, u := range units {
		if (pkg == u.prefix || strings.HasPrefix(pkg, u.prefix+"/")) && (!found || len(u.prefix) > len(best.prefix)) {
			best, found = u, true
		}
	}
	return best, found
}

// may reports whether a package of unit from may import a package of unit
// to.
func may(from, to unit) bool {
	return to.floor < from.floor || to.prefix == from.prefix || slices.Contains(from.also, to.prefix)
}

// pkg is one package of the module: its imports, and its tests'.
type pkg struct {
	path        string
	imports     []string
	testImports []string
}

// modulePackages lists every package of the module (go list).
func modulePackages(t *testing.T, root string) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}|{{join .TestImports \" \"}} {{join .XTestImports \" \"}}", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	own := func(list string) []string {
		var o []string
		for _, p := range strings.Fields(list) {
			if rel, ok := strings.CutPrefix(p, module+"/"); ok {
				o = append(o, rel)
			}
		}
		return o
	}
	var pkgs []pkg
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "|", 3)
		if len(f) != 3 {
			continue
		}
		path := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		pkgs = append(pkgs, pkg{path: path, imports: own(f[1]), testImports: own(f[2])})
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	return pkgs
}

// moduleRoot is the directory of go.mod, two levels up.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// TestLayering: every package of the module is in the table, and imports
// (outside its tests) nothing on a higher floor nor another unit of its
// own floor: no service imports another service, a fixture or the
// composition root; no shared library imports a service.
func TestLayering(t *testing.T) {
	t.Parallel()
	for _, p := range modulePackages(t, moduleRoot(t)) {
		from, ok := unitOf(p.path)
		if !ok {
			t.Errorf("package %q is on no floor: add its directory to the layering table (units)", p.path)
			continue
		}
		for _, imp := range p.imports {
			to, ok := unitOf(imp)
			if !ok {
				t.Errorf("%s imports %s, which is on no floor", p.path, imp)
				continue
			}
			if !may(from, to) {
				t.Errorf("%s (%s, floor %d) imports %s (%s, floor %d): a package imports only lower floors and its own unit",
					p.path, from.prefix, from.floor, imp, to.prefix, to.floor)
			}
		}
	}
}

// TestNothingImportsTestSuites: the test suites are the top floor, even
// for tests: no test outside test/ imports one.
func TestNothingImportsTestSuites(t *testing.T) {
	t.Parallel()
	for _, p := range modulePackages(t, moduleRoot(t)) {
		if strings.HasPrefix(p.path, "test/") {
			continue
		}
		for _, imp := range append(slices.Clone(p.imports), p.testImports...) {
			if imp == "test" || strings.HasPrefix(imp, "test/") {
				t.Errorf("%s imports the test suite %s", p.path, imp)
			}
		}
	}
}

// TestServicesAreTheFive: services/ holds the five services and nothing
// else; shared code goes to internal/, fixtures to demo/.
func TestServicesAreTheFive(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(filepath.Join(moduleRoot(t), "services"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
		if !e.IsDir() || !slices.Contains(theServices, e.Name()) {
			t.Errorf("services/%s is not one of the five services %v: shared code belongs in internal/, fixtures in demo/", e.Name(), theServices)
		}
	}
	for _, s := range theServices {
		if !slices.Contains(got, s) {
			t.Errorf("services/%s is missing", s)
		}
	}
}

// TestTableRowsAreUsed: a row of the table names a directory that exists,
// so the rule cannot drift from the tree.
func TestTableRowsAreUsed(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	for _, u := range units {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(u.prefix))); err != nil {
			t.Errorf("layering row %q (%s): %v", u.prefix, u.why, err)
		}
	}
}
