package apierror_test

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/apierror/reasonscan"
	errorsv1 "github.com/v0m3/v0m3/proto/v0m3/errors/v1"
)

// module is this repository's module path.
const module = "github.com/v0m3/v0m3"

// notErrorReasons are packages whose reason-named constants are not
// error reasons: the operator's Kubernetes condition reasons
// (CamelCase, in MCPServer and definition statuses, and a Deployment's
// ProgressDeadlineExceeded).
var notErrorReasons = []string{module + "/operator/api/v1alpha1", module + "/operator/controller"}

// dynamicReasons are the places whose reason is not a constant the scan
// can read, keyed "file callee expr" (no line, so edits elsewhere do not
// move them; in the orchestrator, whose files are being split into
// packages, "services/orchestrator/… callee expr"), each with where its
// values come from. Those values are
// checked at run time instead: the apierror constructors panic in a test
// binary on a reason the catalogue lacks. A new entry needs the same
// justification; prefer passing a constant.
var dynamicReasons = map[string]string{
	"internal/authz/authz.go internal/apierror.New r.Reason":                       "policy's refusal reason: ROLE_NOT_GRANTED or a forbid policy's @refusal (default.cedar: SELF_APPROVAL, SELF_REVIEW)",
	"internal/bounds/limits.go internal/bounds.TooMany listReason(…)":              "ReasonScopeTooLarge or ReasonTooManyEntries",
	"internal/identity/guard.go internal/identity.refuse reason":                   "TOKEN_INVALID or an AuthError's Reason (scanned where the AuthError is built)",
	"services/adapter/direct.go services/adapter.fail ce.Code":                     "a DirectCallError's Code (scanned where it is built)",
	"services/adapter/direct.go services/adapter.failFact cerr.code":               "an adapter credential error's code (Code* constants)",
	"services/adapter/discover.go internal/apierror.New re.Reason":                 "reach.Error: reach.Reason* constants",
	"services/adapter/execute.go services/adapter.failFact re.Reason":              "reach.Error: reach.Reason* constants",
	"services/adapter/execute.go services/adapter.failFact ce.code":                "an adapter credential error's code (Code* constants)",
	"services/adapter/execute.go services/adapter.fail fmt.Sprintf(…)":             "JSONRPC_<code>: the JSON-RPC error code of a remote error, an attempt's safe code only (never an ErrorInfo reason)",
	"services/adapter/grant.go internal/apierror.New ge.Reason":                    "grant.Error: grant.Reason* constants",
	"services/adapter/oauth.go internal/apierror.New e.reason":                     "authError: CodeAuthenticationRequired, CodeInsufficientScope, CodeAuthorizationServerMismatch",
	"services/adapter/oauth.go services/adapter.failFact e.reason":                 "authError: as above",
	"services/evidence/receipts.go internal/apierror.New re.Reason":                "receipt.Error: receipt.Reason* constants",
	"services/orchestrator/… internal/apierror.New r.GetRefusalReason(…)":          "a recorded request's refusal reason, itself an ErrorInfo reason when it was recorded",
	"services/orchestrator/… internal/apierror.WithMetadata reason":                "DEPENDENCY_<code> (CommonErrorReason DEPENDENCY_*)",
	"services/registry/capabilities.go internal/apierror.InvalidArgument v.reason": "violations.add's reason: registry reason constants",
	"services/registry/connections.go services/registry.invalidConnection reason":  "validateConfig's reason: INVALID_CONNECTION, SECRET_IN_ENV, SECRET_IN_ARGS, INVALID_OAUTH_CONFIG or a reach reason",
}

// TestEveryReasonInTheCodeIsCatalogued reads the module's non-test Go
// code (internal/apierror/reasonscan) and fails on any reason it can use
// that errors.proto does not declare: the argument of an apierror
// constructor or of a function passing it on, a value compared with a
// read reason, a reason field of an error type, and every constant named
// reason*/code*.
func TestEveryReasonInTheCodeIsCatalogued(t *testing.T) {
	res, err := reasonscan.Scan(reasonscan.Options{Root: "../..", Module: module, SkipConstPkgs: notErrorReasons})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Uses) < 300 {
		t.Fatalf("the scan found only %d reason uses; it no longer reads the code it should", len(res.Uses))
	}
	codesOf := map[string][]string{}
	for _, e := range apierror.Catalogue() {
		codesOf[e.Reason] = e.Codes
	}
	for _, u := range res.Uses {
		if apierror.Known(u.Reason) {
			if u.Code != "" && !slices.Contains(codesOf[u.Reason], u.Code) {
				t.Errorf("%s: reason %s is returned with %s, which its catalogue entry does not list (codes %v); add the code to errors.proto or use the reason of that rule", u.Pos, u.Reason, u.Code, codesOf[u.Reason])
			}
			continue
		}
		t.Errorf("%s: reason %q (%s) is not in the catalogue: declare it in proto/v0m3/errors/v1/errors.proto or use the catalogued reason of the same rule", u.Pos, u.Reason, u.How)
	}
	seen := map[string]bool{}
	for _, d := range res.Dynamic {
		file := strings.SplitN(d.Pos, ":", 2)[0]
		if strings.HasPrefix(file, "services/orchestrator/") {
			file = "services/orchestrator/…"
		}
		key := file + " " + d.Call + " " + d.Expr
		seen[key] = true
		if _, ok := dynamicReasons[key]; !ok {
			t.Errorf("%s: %s gets a reason the scan cannot read (%s); pass a catalogued constant, or add it to dynamicReasons saying where its values come from", d.Pos, d.Call, d.Expr)
		}
	}
	for key := range dynamicReasons {
		if !seen[key] {
			t.Errorf("dynamicReasons lists %q, which the scan no longer finds; remove it", key)
		}
	}
}

// TestTheScanFindsAnInventedReason proves the scan test can fail: a
// package that invents a reason inline, through a wrapper and in a
// constant is reported at each place, with the code a call gives.
func TestTheScanFindsAnInventedReason(t *testing.T) {
	dir := t.TempDir()
	write(t, dir+"/go.mod", "module example.com/m\n")
	write(t, dir+"/internal/apierror/a.go", "package apierror\nfunc New(code any, reason, msg string, md map[string]string) error { return nil }\n")
	write(t, dir+"/svc/s.go", `package svc
import (
	"example.com/m/internal/apierror"
	"google.golang.org/grpc/codes"
)
const reasonMadeUp = "MADE_UP_CONST"
func refuse(reason string) error { return apierror.New(9, reason, "no", nil) }
func A() error { return apierror.New(codes.NotFound, "MADE_UP_INLINE", "no", nil) }
func B() error { return refuse("MADE_UP_WRAPPED") }
`)
	res, err := reasonscan.Scan(reasonscan.Options{Root: dir, Module: "example.com/m"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range res.Uses {
		got = append(got, u.Reason)
		if u.Reason == "MADE_UP_INLINE" && u.Code != "NOT_FOUND" {
			t.Errorf("code %q, want NOT_FOUND", u.Code)
		}
	}
	slices.Sort(got)
	if want := []string{"MADE_UP_CONST", "MADE_UP_INLINE", "MADE_UP_WRAPPED"}; !slices.Equal(got, want) {
		t.Errorf("found %v, want %v", got, want)
	}
}

// TestAnUncataloguedReasonPanicsInTests: every constructor refuses a
// reason the catalogue lacks in a test binary, so a test reaching it
// fails.
func TestAnUncataloguedReasonPanicsInTests(t *testing.T) {
	for name, f := range map[string]func(){
		"New":             func() { _ = apierror.New(codes.NotFound, "NO_SUCH_REASON", "x", nil) },
		"InvalidArgument": func() { _ = apierror.InvalidArgument("NO_SUCH_REASON", "x") },
		"Unavailable":     func() { _ = apierror.Unavailable("NO_SUCH_REASON", "x", nil) },
		"Store":           func() { _ = apierror.Store("NO_SUCH_REASON", "x", errors.New("boom")) },
		"WithMetadata":    func() { _ = apierror.WithMetadata(status.Error(codes.Internal, "x"), "NO_SUCH_REASON", "k", "v") },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "NO_SUCH_REASON") {
					t.Errorf("recovered %v, want a panic naming the reason", r)
				}
			}()
			f()
		})
	}
	if r := apierror.Reason(apierror.InvalidArgument(apierror.ReasonFieldRequired, "x")); r != "FIELD_REQUIRED" {
		t.Errorf("a catalogued reason became %q", r)
	}
}

// upperSnake is the form of every reason.
var upperSnake = regexp.MustCompile(`^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$`)

// TestTheCatalogueIsWellFormed: reasons are UPPER_SNAKE and unique, codes
// are gRPC code names, and ReasonOf reads an enum value as its reason.
func TestTheCatalogueIsWellFormed(t *testing.T) {
	codeNames := map[string]bool{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		codeNames[strings.ToUpper(regexp.MustCompile(`([a-z])([A-Z])`).ReplaceAllString(c.String(), "${1}_${2}"))] = true
	}
	codeNames["CANCELLED"] = true // codes.Canceled's name in google.rpc.Code
	entries := apierror.Catalogue()
	if len(entries) < 200 {
		t.Fatalf("%d reasons", len(entries))
	}
	for _, e := range entries {
		if !upperSnake.MatchString(e.Reason) {
			t.Errorf("reason %q is not UPPER_SNAKE", e.Reason)
		}
		for _, c := range e.Codes {
			if !codeNames[c] || c == "OK" {
				t.Errorf("reason %s: %q is not a gRPC error code name", e.Reason, c)
			}
		}
	}
	if r := apierror.ReasonOf(errorsv1.RegistryErrorReason_REGISTRY_ERROR_REASON_MAPPING_UNKNOWN); r != "MAPPING_UNKNOWN" {
		t.Errorf("ReasonOf = %q", r)
	}
	for _, r := range []string{apierror.ReasonFieldRequired, apierror.ReasonFieldInvalid, apierror.ReasonStoreFailure, apierror.ReasonStoreFull, apierror.ReasonStoreUnavailable, apierror.ReasonDependencyUnavailable} {
		if !apierror.Known(r) {
			t.Errorf("%s is not catalogued", r)
		}
	}
}
