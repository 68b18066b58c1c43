package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/v0m3/v0m3/internal/identity"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/registry"
)

const definitionsUsage = `Usage:
  v0m3 %[1]s apply -f FILE          declare or revise a %[1]s from YAML or JSON
  v0m3 %[1]s list [--all]           list them (--all: with deprecated ones)
  v0m3 %[1]s get NAME [--revision N] print one, current or a past revision, as YAML
  v0m3 %[1]s deprecate NAME --reason TEXT [--expected-revision N]

Every verb calls the registry as you: --token (or V0M3_TOKEN) is your bearer
token, e.g. from 'v0m3 token --subject ines --groups platform'.
`

// registryFlags are how a definitions verb reaches the registry as the
// person running it.
type registryFlags struct {
	addr, token, caFile *string
	insecure            *bool
}

func addRegistryFlags(fs *flag.FlagSet) *registryFlags {
	return &registryFlags{
		addr:     fs.String("registry-addr", defaultAddr("registry"), "registry address"),
		token:    fs.String("token", "", "your bearer token (V0M3_TOKEN)"),
		caFile:   fs.String("tls-ca-file", "./.v0m3-data/pki/ca.crt", "PEM CA bundle the registry's certificate chains to"),
		insecure: fs.Bool("insecure-plaintext", false, "DEVELOPMENT ONLY: the registry serves plaintext"),
	}
}

// dial connects to the registry and returns a client and the context that
// carries the token.
func (f *registryFlags) dial(ctx context.Context) (registryv1.RegistryServiceClient, context.Context, func(), error) {
	if *f.token == "" {
		return nil, nil, nil, usageError{"--token (or V0M3_TOKEN) is required: the registry decides what you may do from who your token names"}
	}
	conn, err := dialAs(*f.addr, *f.caFile, *f.insecure, "the registry")
	if err != nil {
		return nil, nil, nil, err
	}
	return registryv1.NewRegistryServiceClient(conn), identity.WithBearer(ctx, *f.token), func() { _ = conn.Close() }, nil
}

// dialAs connects to the service what at addr as a caller: mutual TLS
// verified against the CA bundle in caFile, or plaintext when insecure
// (development only). The bearer token travels in each call's context.
func dialAs(addr, caFile string, insecure bool, what string) (*grpc.ClientConn, error) {
	var roots *x509.CertPool
	if !insecure {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read --tls-ca-file: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca-file %s holds no PEM certificate", caFile)
		}
	}
	conn, err := grpc.NewClient(addr, identity.CallerDialOptions(roots)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s at %s: %w", what, addr, err)
	}
	return conn, nil
}

// definitionKind is what differs between `v0m3 capability` and `v0m3
// profile`.
type definitionKind[M interface {
	proto.Message
	GetName() string
	GetRevision() int64
	GetState() registryv1.DefinitionState
}] struct {
	name      string
	new       func() M
	create    func(context.Context, registryv1.RegistryServiceClient, M) (M, error)
	update    func(context.Context, registryv1.RegistryServiceClient, M, int64) (M, error)
	get       func(context.Context, registryv1.RegistryServiceClient, string, int64) (M, error)
	list      func(context.Context, registryv1.RegistryServiceClient, bool) ([]M, error)
	deprecate func(context.Context, registryv1.RegistryServiceClient, string, string, int64) (M, error)
	describe  func(M) string
}

var capabilityKind = definitionKind[*registryv1.Capability]{
	name: "capability",
	new:  func() *registryv1.Capability { return &registryv1.Capability{} },
	create: func(ctx context.Context, c registryv1.RegistryServiceClient, m *registryv1.Capability) (*registryv1.Capability, error) {
		return c.CreateCapability(ctx, &registryv1.CreateCapabilityRequest{Capability: m})
	},
	update: func(ctx context.Context, c registryv1.RegistryServiceClient, m *registryv1.Capability, expected int64) (*registryv1.Capability, error) {
		return c.UpdateCapability(ctx, &registryv1.UpdateCapabilityRequest{Capability: m, ExpectedRevision: expected})
	},
	get: func(ctx context.Context, c registryv1.RegistryServiceClient, name string, rev int64) (*registryv1.Capability, error) {
		return c.GetCapability(ctx, &registryv1.GetCapabilityRequest{Name: name, Revision: rev})
	},
	list: func(ctx context.Context, c registryv1.RegistryServiceClient, all bool) ([]*registryv1.Capability, error) {
		return collectPages(ctx, func(ctx context.Context, tok string) ([]*registryv1.Capability, string, error) {
			r, err := c.ListCapabilities(ctx, &registryv1.ListCapabilitiesRequest{ShowDeprecated: all, PageSize: maxPageSize, PageToken: tok})
			return r.GetCapabilities(), r.GetNextPageToken(), err
		})
	},
	deprecate: func(ctx context.Context, c registryv1.RegistryServiceClient, name, reason string, expected int64) (*registryv1.Capability, error) {
		return c.DeprecateCapability(ctx, &registryv1.DeprecateCapabilityRequest{Name: name, Reason: reason, ExpectedRevision: expected})
	},
	describe: func(c *registryv1.Capability) string {
		return enumWord(c.GetEffectClass().String(), "EFFECT_CLASS_") + "\t" + c.GetManagedBy()
	},
}

var profileKind = definitionKind[*registryv1.TaskProfile]{
	name: "profile",
	new:  func() *registryv1.TaskProfile { return &registryv1.TaskProfile{} },
	create: func(ctx context.Context, c registryv1.RegistryServiceClient, m *registryv1.TaskProfile) (*registryv1.TaskProfile, error) {
		return c.CreateTaskProfile(ctx, &registryv1.CreateTaskProfileRequest{Profile: m})
	},
	update: func(ctx context.Context, c registryv1.RegistryServiceClient, m *registryv1.TaskProfile, expected int64) (*registryv1.TaskProfile, error) {
		return c.UpdateTaskProfile(ctx, &registryv1.UpdateTaskProfileRequest{Profile: m, ExpectedRevision: expected})
	},
	get: func(ctx context.Context, c registryv1.RegistryServiceClient, name string, rev int64) (*registryv1.TaskProfile, error) {
		return c.GetTaskProfile(ctx, &registryv1.GetTaskProfileRequest{Name: name, Revision: rev})
	},
	list: func(ctx context.Context, c registryv1.RegistryServiceClient, all bool) ([]*registryv1.TaskProfile, error) {
		return collectPages(ctx, func(ctx context.Context, tok string) ([]*registryv1.TaskProfile, string, error) {
			r, err := c.ListTaskProfiles(ctx, &registryv1.ListTaskProfilesRequest{ShowDeprecated: all, PageSize: maxPageSize, PageToken: tok})
			return r.GetProfiles(), r.GetNextPageToken(), err
		})
	},
	deprecate: func(ctx context.Context, c registryv1.RegistryServiceClient, name, reason string, expected int64) (*registryv1.TaskProfile, error) {
		return c.DeprecateTaskProfile(ctx, &registryv1.DeprecateTaskProfileRequest{Name: name, Reason: reason, ExpectedRevision: expected})
	},
	describe: func(p *registryv1.TaskProfile) string {
		needs := make([]string, 0, len(p.GetNeeds()))
		for _, n := range p.GetNeeds() {
			needs = append(needs, n.GetCapability())
		}
		return strings.Join(needs, ",") + "\t" + p.GetManagedBy()
	},
}

func runCapability(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runDefinitions(ctx, capabilityKind, args, stdout, stderr)
}

func runProfile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runDefinitions(ctx, profileKind, args, stdout, stderr)
}

func runDefinitions[M interface {
	proto.Message
	GetName() string
	GetRevision() int64
	GetState() registryv1.DefinitionState
}](ctx context.Context, k definitionKind[M], args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(stderr, definitionsUsage, k.name)
		if len(args) == 0 {
			return usageError{"a verb is required: apply, list, get or deprecate"}
		}
		return errHelp
	}
	verb, rest := args[0], args[1:]
	fs := newFlags(k.name+" "+verb, stderr)
	rf := addRegistryFlags(fs)
	var name string
	switch verb {
	case "get", "deprecate":
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			return usageError{fmt.Sprintf("v0m3 %s %s NAME: the name is required", k.name, verb)}
		}
		name, rest = rest[0], rest[1:]
	}
	var (
		file     = new(string)
		expected = new(int64)
		all      = new(bool)
		revision = new(int64)
		reason   = new(string)
	)
	switch verb {
	case "apply":
		fs.StringVar(file, "f", "", "YAML or JSON file holding one "+k.name+" (\"-\": standard input)")
		fs.Int64Var(expected, "expected-revision", 0, "fail unless the current revision is this one (0: the revision read just before)")
	case "list":
		fs.BoolVar(all, "all", false, "include deprecated ones")
	case "get":
		fs.Int64Var(revision, "revision", 0, "a past revision (0: current)")
	case "deprecate":
		fs.StringVar(reason, "reason", "", "why, for reviewers and task owners (required)")
		fs.Int64Var(expected, "expected-revision", 0, "fail unless the current revision is this one, the one you read (0: whatever is current)")
	default:
		fmt.Fprintf(stderr, definitionsUsage, k.name)
		return usageError{fmt.Sprintf("unknown verb %q", verb)}
	}
	if err := parse(fs, rest); err != nil {
		return err
	}
	client, ctx, closeConn, err := rf.dial(ctx)
	if err != nil {
		return err
	}
	defer closeConn()
	switch verb {
	case "apply":
		if *file == "" {
			return usageError{"-f FILE is required"}
		}
		return applyDefinition(ctx, k, client, *file, *expected, stdout)
	case "list":
		items, err := k.list(ctx, client, *all)
		if err != nil {
			return rpcError(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		if k.name == "capability" {
			fmt.Fprintln(tw, "NAME\tREVISION\tSTATE\tEFFECT\tMANAGED BY")
		} else {
			fmt.Fprintln(tw, "NAME\tREVISION\tSTATE\tNEEDS\tMANAGED BY")
		}
		for _, m := range items {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", m.GetName(), m.GetRevision(), enumWord(m.GetState().String(), "DEFINITION_STATE_"), k.describe(m))
		}
		return tw.Flush()
	case "get":
		m, err := k.get(ctx, client, name, *revision)
		if err != nil {
			return rpcError(err)
		}
		return printYAML(stdout, m)
	default: // deprecate
		if strings.TrimSpace(*reason) == "" {
			return usageError{"--reason is required"}
		}
		m, err := k.deprecate(ctx, client, name, *reason, *expected)
		if err != nil {
			return rpcError(err)
		}
		fmt.Fprintf(stdout, "%s %s: deprecated at revision %d\n", k.name, m.GetName(), m.GetRevision())
		return nil
	}
}

// applyDefinition creates the definition in file or, when it exists,
// declares it as a new revision (a compare-and-set on the revision read
// just before), and says which happened: created, updated or unchanged.
func applyDefinition[M interface {
	proto.Message
	GetName() string
	GetRevision() int64
	GetState() registryv1.DefinitionState
}](ctx context.Context, k definitionKind[M], client registryv1.RegistryServiceClient, file string, expected int64, stdout io.Writer) error {
	var b []byte
	var err error
	if file == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return err
	}
	m := k.new()
	if err := registry.DecodeDefinition(b, m); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	created, err := k.create(ctx, client, m)
	if err == nil {
		fmt.Fprintf(stdout, "%s %s: created at revision %d\n", k.name, created.GetName(), created.GetRevision())
		return nil
	}
	if status.Code(err) != codes.AlreadyExists {
		return rpcError(err)
	}
	cur, err := k.get(ctx, client, m.GetName(), 0)
	if err != nil {
		return rpcError(err)
	}
	if expected == 0 {
		expected = cur.GetRevision()
	}
	out, err := k.update(ctx, client, m, expected)
	if err != nil {
		return rpcError(err)
	}
	switch {
	case out.GetRevision() == cur.GetRevision():
		fmt.Fprintf(stdout, "%s %s: unchanged at revision %d\n", k.name, out.GetName(), out.GetRevision())
	case k.name == "capability":
		fmt.Fprintf(stdout, "%s %s: updated to revision %d; its active mappings need review against it\n", k.name, out.GetName(), out.GetRevision())
	default:
		fmt.Fprintf(stdout, "%s %s: updated to revision %d\n", k.name, out.GetName(), out.GetRevision())
	}
	return nil
}

// printYAML writes m in the form apply reads.
func printYAML(w io.Writer, m proto.Message) error {
	j, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		return err
	}
	_, err = w.Write(y)
	return err
}

// rpcError turns a registry refusal into what a person reads: its
// message (which names each field at fault) and its reason.
func rpcError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			msg += " (" + info.GetReason() + ")"
		}
	}
	return errors.New(msg)
}

func enumWord(s, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s, prefix))
}

// maxPageSize is the largest page the services return.
const maxPageSize = 1000

// collectPages calls fetch for every page of a list and returns all items.
func collectPages[T any](ctx context.Context, fetch func(ctx context.Context, token string) ([]T, string, error)) ([]T, error) {
	var all []T
	tok := ""
	for {
		items, next, err := fetch(ctx, tok)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" || next == tok {
			return all, nil
		}
		tok = next
	}
}
