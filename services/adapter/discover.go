package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
)

// Discovery bounds: a server cannot make discovery unbounded by paging
// forever or describing itself at length.
const (
	discoverTimeout    = 60 * time.Second
	maxListedItems     = 10000
	maxDescriptionLen  = 16 << 10
	maxNameLen         = 256
	maxURILen          = 2048
	maxIcons           = 16
	maxPromptArguments = 256
)

// Discover connects to a connection's server, lists every tool, resource,
// resource template and prompt it declares, and records what it saw as a
// registry snapshot. The registry computes the digests.
func (s *Server) Discover(ctx context.Context, req *adapterv1.DiscoverRequest) (*registryv1.DiscoverySnapshot, error) {
	if err := s.mayDiscover(ctx, req.GetConnectionId()); err != nil {
		return nil, err
	}
	if req.GetConnectionId() == "" {
		return nil, apierror.InvalidArgument(apierror.ReasonFieldRequired, "connection_id is required",
			apierror.FieldViolation{Field: "connection_id", Description: "required"})
	}
	conn, err := s.connection(ctx, req.GetConnectionId())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, discoverTimeout)
	defer cancel()
	retrieved := time.Now()
	switch {
	case s.replaying():
		snap, err := s.replayDiscover(conn)
		if err != nil {
			return nil, err
		}
		return s.recordSnapshot(ctx, conn, snap, retrieved)
	case conn.GetTransport().GetDirect() != nil:
		src, err := s.directSource(conn)
		if err != nil {
			return nil, err
		}
		snap, err := src.Describe(ctx)
		if err != nil {
			return nil, apierror.New(codes.Internal, "DIRECT_DESCRIBE_FAILED", "the direct adapter could not describe its source", nil)
		}
		if s.recording() {
			s.recordDiscovery(conn, snap)
		}
		return s.recordSnapshot(ctx, conn, snap, retrieved)
	}
	ss, err := s.openSession(ctx, conn, discoveryMessageLimit, nil)
	if err != nil {
		if err := connectError(conn.GetId(), err, ss.m); err != nil {
			return nil, err
		}
		return nil, s.discoveryFailed(ctx, conn.GetId(), err, ss.m)
	}
	defer ss.close()
	ss.m.tap.Store(newWireTap())
	snap, err := describeStable(ctx, ss)
	if errors.Is(err, errUnstable) {
		s.log.Warn("discovery: the server's lists kept changing", "connection_id", conn.GetId(), "listings", maxListings)
		s.reportHealth(ctx, conn.GetId(), false, "the server's lists kept changing during discovery")
		return nil, apierror.New(codes.Unavailable, "DISCOVERY_UNSTABLE",
			fmt.Sprintf("connection %s described different tools, resources, resource templates or prompts on each of %d listings; no snapshot was recorded. Try again once the server is stable", conn.GetId(), maxListings),
			map[string]string{"connection_id": conn.GetId()})
	}
	if err != nil {
		return nil, s.discoveryFailed(ctx, conn.GetId(), err, ss.m)
	}
	if s.recording() {
		s.recordDiscovery(conn, snap)
	}
	return s.recordSnapshot(ctx, conn, snap, retrieved)
}

// recordSnapshot records what a discovery saw as a registry snapshot of
// the connection at its current config revision.
func (s *Server) recordSnapshot(ctx context.Context, conn *registryv1.Connection, snap *registryv1.DiscoverySnapshot, retrieved time.Time) (*registryv1.DiscoverySnapshot, error) {
	snap.ConnectionId = conn.GetId()
	snap.ConfigRevision = conn.GetConfigRevision()
	snap.RetrieveTime = timestamppb.New(retrieved)
	s.reportHealth(ctx, conn.GetId(), true, "")
	rec, err := s.deps.Registry.RecordSnapshot(ctx, &registryv1.RecordSnapshotRequest{Snapshot: snap})
	if err != nil {
		return nil, apierror.Propagate(err, "record snapshot")
	}
	s.log.Info("discovered", "connection_id", conn.GetId(), "snapshot_id", rec.GetId(),
		"tools", len(snap.Tools), "resources", len(snap.Resources), "resource_templates", len(snap.ResourceTemplates),
		"prompts", len(snap.Prompts), "protocol_version", snap.ProtocolVersion)
	return rec, nil
}

// connectError maps the connect failures a caller can act on (gRPC errors
// from the registry, an unresolvable credential, an endpoint or executable
// the platform does not allow, shutdown) to their errors; any other
// failure gives nil and is the server's.
func connectError(connectionID string, err error, m *meter) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if re := refusal(err, m); re != nil {
		return apierror.New(codes.FailedPrecondition, re.Reason,
			fmt.Sprintf("connection %s: %s", connectionID, re.Detail),
			map[string]string{"connection_id": connectionID})
	}
	if ae := authFailure(err, m); ae != nil {
		return ae.status(connectionID)
	}
	var ce *credentialError
	var cr *credentialRefusedError
	switch {
	case errors.As(err, &cr):
		return apierror.New(codes.FailedPrecondition, CodeCredentialRefNotAllowed,
			fmt.Sprintf("connection %s: %v", connectionID, cr),
			map[string]string{"connection_id": connectionID})
	case errors.As(err, &ce):
		return apierror.New(codes.FailedPrecondition, "CREDENTIAL_UNAVAILABLE",
			fmt.Sprintf("connection %s: %v; check the credential source is mounted and readable", connectionID, ce),
			map[string]string{"connection_id": connectionID})
	case errors.Is(err, errAdapterClosed):
		return apierror.New(codes.Unavailable, "ADAPTER_SHUTTING_DOWN", "the adapter is shutting down; retry on another instance", nil)
	}
	if se, ok := sandboxSetupError(err); ok {
		return apierror.New(codes.FailedPrecondition, CodeSandboxUnavailable,
			fmt.Sprintf("connection %s: the local server was not started: %v", connectionID, se),
			map[string]string{"connection_id": connectionID})
	}
	return nil
}

// maxListings bounds how often discovery lists a server whose lists keep
// changing.
const maxListings = 3

var errUnstable = errors.New("lists kept changing")

// describeStable lists until two consecutive listings agree, so a snapshot
// is one consistent view even when the server changes its lists
// mid-session (whether or not it sends list_changed notifications). The
// later of the two agreeing listings is returned.
func describeStable(ctx context.Context, ss *session) (*registryv1.DiscoverySnapshot, error) {
	prev, err := describe(ctx, ss)
	if err != nil {
		return nil, err
	}
	for range maxListings - 1 {
		next, err := describe(ctx, ss)
		if err != nil {
			return nil, err
		}
		if proto.Equal(prev, next) {
			return next, nil
		}
		prev = next
	}
	return nil, errUnstable
}

// discoveryFailed reports the connection degraded and returns the error a
// caller sees. The cause is logged for operators, never returned: it may
// hold remote text.
func (s *Server) discoveryFailed(ctx context.Context, connectionID string, cause error, m *meter) error {
	if isLimitError(cause, m) {
		s.log.Warn("discovery response over limit", "connection_id", connectionID, "limit", discoveryMessageLimit)
		s.reportHealth(ctx, connectionID, false, "discovery response exceeded the adapter's limit")
		return apierror.New(codes.ResourceExhausted, "DISCOVERY_LIMIT_EXCEEDED",
			fmt.Sprintf("a discovery message from connection %s exceeded %d bytes", connectionID, discoveryMessageLimit),
			map[string]string{"connection_id": connectionID})
	}
	if pv := unsupportedVersion(cause); pv != nil {
		s.log.Warn("discovery: protocol version unsupported", "connection_id", connectionID, "server_version", pv.version)
		s.reportHealth(ctx, connectionID, false, "protocol version unsupported")
		return pv.status(connectionID)
	}
	s.log.Warn("discovery failed", "connection_id", connectionID, "error", logText(cause))
	s.reportHealth(ctx, connectionID, false, "server unreachable")
	return apierror.New(codes.Unavailable, "SERVER_UNREACHABLE",
		fmt.Sprintf("could not discover connection %s: the server could not be reached or broke the session", connectionID),
		map[string]string{"connection_id": connectionID})
}

// describe lists a session's tools, resources, resource templates and
// prompts (all pages) into a snapshot without identity fields. Templates
// and prompts are listed only when the server declared them.
func describe(ctx context.Context, ss *session) (*registryv1.DiscoverySnapshot, error) {
	init := ss.initializeResult()
	snap := &registryv1.DiscoverySnapshot{ServerInfo: serverInfo(ss)}
	var caps *mcp.ServerCapabilities
	if init != nil {
		snap.ProtocolVersion = init.ProtocolVersion
		caps = init.Capabilities
	}
	if caps == nil || caps.Tools != nil {
		if tap := ss.m.tap.Load(); tap != nil {
			tap.reset()
		}
		for t, err := range ss.tools(ctx) {
			if err != nil {
				return nil, fmt.Errorf("list tools: %w", err)
			}
			if len(snap.Tools) == maxListedItems {
				return nil, fmt.Errorf("list tools: more than %d tools", maxListedItems)
			}
			ti, err := toolIdentity(ss, t)
			if err != nil {
				return nil, err
			}
			snap.Tools = append(snap.Tools, ti)
		}
	}
	if caps == nil || caps.Resources != nil {
		for r, err := range ss.resources(ctx) {
			if err != nil {
				return nil, fmt.Errorf("list resources: %w", err)
			}
			if len(snap.Resources) == maxListedItems {
				return nil, fmt.Errorf("list resources: more than %d resources", maxListedItems)
			}
			ri := &registryv1.ResourceIdentity{
				Uri:         truncate(r.URI, maxURILen),
				Name:        truncate(r.Name, maxNameLen),
				Title:       truncate(r.Title, maxNameLen),
				Description: truncate(r.Description, maxDescriptionLen),
				MimeType:    truncate(r.MIMEType, maxNameLen),
				Size:        r.Size,
				Icons:       icons(r.Icons),
			}
			if r.Annotations != nil {
				if ri.Annotations, err = toStruct(r.Annotations); err != nil {
					return nil, fmt.Errorf("resource annotations: %w", err)
				}
			}
			snap.Resources = append(snap.Resources, ri)
		}
	}
	if caps != nil && caps.Resources != nil {
		for rt, err := range ss.resourceTemplates(ctx) {
			if methodNotFound(err) {
				// A server may offer resources without templates.
				snap.ResourceTemplates = nil
				break
			}
			if err != nil {
				return nil, fmt.Errorf("list resource templates: %w", err)
			}
			if len(snap.ResourceTemplates) == maxListedItems {
				return nil, fmt.Errorf("list resource templates: more than %d templates", maxListedItems)
			}
			ti := &registryv1.ResourceTemplateIdentity{
				UriTemplate: truncate(rt.URITemplate, maxURILen),
				Name:        truncate(rt.Name, maxNameLen),
				Title:       truncate(rt.Title, maxNameLen),
				Description: truncate(rt.Description, maxDescriptionLen),
				MimeType:    truncate(rt.MIMEType, maxNameLen),
				Icons:       icons(rt.Icons),
			}
			if rt.Annotations != nil {
				if ti.Annotations, err = toStruct(rt.Annotations); err != nil {
					return nil, fmt.Errorf("resource template annotations: %w", err)
				}
			}
			snap.ResourceTemplates = append(snap.ResourceTemplates, ti)
		}
	}
	if caps != nil && caps.Prompts != nil {
		for p, err := range ss.prompts(ctx) {
			if err != nil {
				return nil, fmt.Errorf("list prompts: %w", err)
			}
			if len(snap.Prompts) == maxListedItems {
				return nil, fmt.Errorf("list prompts: more than %d prompts", maxListedItems)
			}
			if len(p.Arguments) > maxPromptArguments {
				return nil, fmt.Errorf("list prompts: a prompt has more than %d arguments", maxPromptArguments)
			}
			pi := &registryv1.PromptIdentity{
				Name:        truncate(p.Name, maxNameLen),
				Title:       truncate(p.Title, maxNameLen),
				Description: truncate(p.Description, maxDescriptionLen),
				Icons:       icons(p.Icons),
			}
			for _, a := range p.Arguments {
				if a == nil {
					continue
				}
				pi.Arguments = append(pi.Arguments, &registryv1.PromptArgument{
					Name:        truncate(a.Name, maxNameLen),
					Title:       truncate(a.Title, maxNameLen),
					Description: truncate(a.Description, maxDescriptionLen),
					Required:    a.Required,
				})
			}
			snap.Prompts = append(snap.Prompts, pi)
		}
	}
	slices.SortFunc(snap.Tools, func(a, b *registryv1.ToolIdentity) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(snap.Resources, func(a, b *registryv1.ResourceIdentity) int { return strings.Compare(a.Uri, b.Uri) })
	slices.SortFunc(snap.ResourceTemplates, func(a, b *registryv1.ResourceTemplateIdentity) int {
		return strings.Compare(a.UriTemplate, b.UriTemplate)
	})
	slices.SortFunc(snap.Prompts, func(a, b *registryv1.PromptIdentity) int { return strings.Compare(a.Name, b.Name) })
	return snap, nil
}

// toolIdentity is one listed tool as the snapshot records it.
func toolIdentity(ss *session, t *mcp.Tool) (*registryv1.ToolIdentity, error) {
	ti := &registryv1.ToolIdentity{
		Name:        truncate(t.Name, maxNameLen),
		Title:       truncate(t.Title, maxNameLen),
		Description: truncate(t.Description, maxDescriptionLen),
		Icons:       icons(t.Icons),
	}
	var err error
	if ti.InputSchema, err = toStruct(t.InputSchema); err != nil {
		return nil, fmt.Errorf("tool input schema: %w", err)
	}
	if ti.OutputSchema, err = toStruct(t.OutputSchema); err != nil {
		return nil, fmt.Errorf("tool output schema: %w", err)
	}
	if t.Annotations != nil {
		if ti.Annotations, err = toStruct(t.Annotations); err != nil {
			return nil, fmt.Errorf("tool annotations: %w", err)
		}
	}
	exec, err := ss.toolExecution(t.Name)
	if err != nil {
		return nil, err
	}
	if ti.Execution, err = toStruct(exec); err != nil {
		return nil, fmt.Errorf("tool execution: %w", err)
	}
	return ti, nil
}

// icons converts declared icons, keeping the first maxIcons; sources are
// bounded like descriptions (a data URI can be long).
func icons(in []mcp.Icon) []*registryv1.Icon {
	if len(in) > maxIcons {
		in = in[:maxIcons]
	}
	var out []*registryv1.Icon
	for _, ic := range in {
		var sizes []string
		for _, sz := range ic.Sizes[:min(len(ic.Sizes), maxIcons)] {
			sizes = append(sizes, truncate(sz, 32))
		}
		out = append(out, &registryv1.Icon{
			Src:      truncate(ic.Source, maxDescriptionLen),
			MimeType: truncate(ic.MIMEType, maxNameLen),
			Sizes:    sizes,
			Theme:    truncate(string(ic.Theme), 32),
		})
	}
	return out
}

// methodNotFound reports whether err is the server's JSON-RPC "method not
// found".
func methodNotFound(err error) bool {
	var w *jsonrpc.Error
	return err != nil && errors.As(err, &w) && w.Code == jsonrpc.CodeMethodNotFound
}

// toStruct converts a JSON object value into a Struct; nil and JSON null
// give nil.
func toStruct(v any) (*structpb.Struct, error) {
	if v == nil {
		return nil, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	if m == nil {
		return nil, nil
	}
	return structpb.NewStruct(m)
}

// mayDiscover checks that the caller may have the adapter connect to a
// server and describe it: a peer the access table admitted, or a person
// whom policy grants connection.discover.
func (s *Server) mayDiscover(ctx context.Context, connectionID string) error {
	_, err := authz.Remote(s.deps.Policy).Require(ctx, authz.ConnectionDiscover, authz.Resource{Type: "connection", ID: connectionID}, nil)
	return err
}
