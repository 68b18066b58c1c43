// Package registry is the V0M3 registry service: the single writer of
// connections, their configuration revisions, discovery snapshots,
// capabilities, mappings and review states, and of the events that describe
// every change.
//
// Connecting a server registers nothing. A capability becomes usable only
// through a reviewed, active mapping, and a mapping stops being usable the
// moment what it was reviewed against (configuration, input schema or
// description) changes.
package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/authz"
	"github.com/v0m3/v0m3/internal/reach"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/internal/telemetry"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Server implements registryv1.RegistryServiceServer on a Store.
type Server struct {
	registryv1.UnimplementedRegistryServiceServer

	st  Store
	log *slog.Logger
	now func() time.Time
	// reach is the platform's reachability policy, set by WithReach; nil
	// checks only the rules every policy shares.
	reach *reach.Policy

	// changed is closed (and replaced) after every committed change, so
	// WatchEvents streams wake without polling. Changes committed by another
	// process sharing the store are picked up by the poll fallback.
	mu      sync.Mutex
	changed chan struct{}
	// authz decides callers' administrative actions.
	authz authz.Decider
	// mappingConnections maps a mapping id to its connection id, which
	// never changes once the mapping exists: ResolveExecution reads the
	// connection with the mapping when it knows it.
	mappingConnections *lru.Cache[string, string]
}

// maxMappingConnections bounds mappingConnections; a mapping it dropped
// costs one more store read.
const maxMappingConnections = 8192

// NewServer returns a registry server on st.
func NewServer(st Store, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	conns, err := lru.New[string, string](maxMappingConnections)
	if err != nil {
		panic(err) // only for a size <= 0
	}
	return &Server{st: st, log: log, now: time.Now, changed: make(chan struct{}), mappingConnections: conns}
}

// WithReach makes CreateConnection and UpdateConnection refuse, early and
// with a clear reason, the endpoints and executables the adapter would
// refuse under p (configure both with the same policy). Without it the
// registry refuses only what every policy refuses (link-local and
// metadata endpoints, relative executable paths, loader variables) and
// leaves loopback, private ranges and stdio roots to the adapter, which
// enforces them either way. The registry must see the adapter's
// filesystem for p.StdioRoots to mean anything here.
func (s *Server) WithReach(p reach.Policy) *Server {
	s.reach = &p
	return s
}

// reachPolicy is the policy endpoints are checked against early.
func (s *Server) reachPolicy() reach.Policy {
	if s.reach != nil {
		return *s.reach
	}
	return reach.Policy{AllowLoopback: true, AllowPrivate: true}
}

// checkExecutable decides a stdio command that is a path. A missing file
// passes: the adapter decides when it would start it.
func (s *Server) checkExecutable(command string) *reach.Error {
	if !filepath.IsAbs(command) {
		return &reach.Error{Reason: reach.ReasonExecutable,
			Detail: fmt.Sprintf("executable %q is neither an absolute path nor a bare name; relative paths depend on the adapter's working directory", command)}
	}
	if s.reach == nil {
		return nil
	}
	_, err := s.reach.CheckExecutable(command)
	if re, ok := reach.AsError(err); ok {
		return re
	}
	return nil
}

// timestamp returns the current time as a proto timestamp.
func (s *Server) timestamp() *timestamppb.Timestamp { return timestamppb.New(s.now()) }

// changes returns a channel closed at the next committed change.
func (s *Server) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// notify wakes every watcher.
func (s *Server) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.changed)
	s.changed = make(chan struct{})
}

// event builds an event stamped now; the store assigns its sequence.
func (s *Server) event(t registryv1.RegistryEventType, connID, mappingID, snapshotID, detail string) *registryv1.RegistryEvent {
	telemetry.RegistryEvents.WithLabelValues(strings.ToLower(strings.TrimPrefix(t.String(), "REGISTRY_EVENT_TYPE_"))).Inc()
	return &registryv1.RegistryEvent{
		Type:         t,
		ConnectionId: connID,
		MappingId:    mappingID,
		SnapshotId:   snapshotID,
		Detail:       detail,
		Time:         s.timestamp(),
	}
}

// updateConnection runs fn on one connection in a store transaction and
// translates the outcome into an API error. A missing connection is
// NOT_FOUND CONNECTION_UNKNOWN.
func (s *Server) updateConnection(ctx context.Context, id string, fn func(*ConnectionUpdate) error) error {
	err := s.st.UpdateConnection(ctx, id, func(u *ConnectionUpdate) error {
		withServing(u.Connection)
		return fn(u)
	})
	if err != nil {
		return s.storeError(ctx, err, "update connection", func() error { return connectionUnknown(id) })
	}
	s.notify()
	return nil
}

// storeError turns a store failure into what a client sees: status errors
// built by the server pass through unchanged, ErrNotFound becomes
// notFound(), cancellations keep their code, anything else is logged and
// reported as INTERNAL without detail.
func (s *Server) storeError(ctx context.Context, err error, op string, notFound func() error) error {
	var se interface{ GRPCStatus() *status.Status }
	switch {
	case errors.As(err, &se):
		return se.GRPCStatus().Err()
	case errors.Is(err, store.ErrNotFound) && notFound != nil:
		return notFound()
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	s.log.ErrorContext(ctx, "registry store failure", "op", op, "error", err)
	return apierror.Store(apierror.ReasonStoreFailure, fmt.Sprintf("%s failed in the registry store", op), err)
}

func connectionUnknown(id string) error {
	return apierror.New(codes.NotFound, "CONNECTION_UNKNOWN",
		fmt.Sprintf("connection %q does not exist", id), map[string]string{"connection_id": id})
}

func connectionRetired(c *registryv1.Connection) error {
	return apierror.New(codes.FailedPrecondition, "CONNECTION_RETIRED",
		fmt.Sprintf("connection %s was retired at %s; it is kept for history and cannot change or be used",
			c.GetId(), c.GetRetireTime().AsTime().Format(time.RFC3339)),
		map[string]string{"connection_id": c.GetId()})
}

func required(field, description string) error {
	return apierror.InvalidArgument(apierror.ReasonFieldRequired, field+" is required",
		apierror.FieldViolation{Field: field, Description: description})
}
