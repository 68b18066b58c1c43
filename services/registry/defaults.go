package registry

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/store"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// ManagedByDefaults is the managed_by of the default definitions.
const ManagedByDefaults = "v0m3/defaults"

// defaultFiles are the seed's four capabilities and four task profiles,
// as data: the same YAML a platform team applies with `v0m3 capability
// apply` or `v0m3 profile apply`.
//
//go:embed defaults/capabilities/*.yaml defaults/profiles/*.yaml
var defaultFiles embed.FS

// DefaultCapabilities returns the default capability definitions shipped
// with V0M3, validated and resolved as the registry stores them (without
// revision or creation stamps), sorted by name.
func DefaultCapabilities() ([]*registryv1.Capability, error) {
	raw, err := readDefaults("defaults/capabilities", func() *registryv1.Capability { return &registryv1.Capability{} })
	if err != nil {
		return nil, err
	}
	out := make([]*registryv1.Capability, 0, len(raw))
	for _, c := range raw {
		c.ManagedBy = ManagedByDefaults
		v, err := validateCapability(c)
		if err != nil {
			return nil, fmt.Errorf("default capability %s: %w", c.GetName(), err)
		}
		out = append(out, v)
	}
	return out, nil
}

// DefaultTaskProfiles returns the default task profiles shipped with
// V0M3, sorted by name.
func DefaultTaskProfiles() ([]*registryv1.TaskProfile, error) {
	raw, err := readDefaults("defaults/profiles", func() *registryv1.TaskProfile { return &registryv1.TaskProfile{} })
	if err != nil {
		return nil, err
	}
	out := make([]*registryv1.TaskProfile, 0, len(raw))
	for _, p := range raw {
		p.ManagedBy = ManagedByDefaults
		v, err := validateProfile(p)
		if err != nil {
			return nil, fmt.Errorf("default task profile %s: %w", p.GetName(), err)
		}
		out = append(out, v)
	}
	return out, nil
}

func readDefaults[M interface {
	proto.Message
	GetName() string
}](dir string, newMsg func() M) ([]M, error) {
	entries, err := fs.ReadDir(defaultFiles, dir)
	if err != nil {
		return nil, err
	}
	var out []M
	for _, e := range entries {
		b, err := defaultFiles.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		m := newMsg()
		if err := DecodeDefinition(b, m); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		if want := strings.TrimSuffix(e.Name(), ".yaml"); m.GetName() != want {
			return nil, fmt.Errorf("%s declares %q; a default's file is named after it", e.Name(), m.GetName())
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b M) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, nil
}

// DecodeDefinition reads a capability or task profile from YAML or JSON
// in its protobuf JSON form (field names as in the proto, e.g.
// effect_class; enums by name). Unknown fields fail, so a typo never
// silently drops part of a contract.
func DecodeDefinition(b []byte, m proto.Message) error {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return fmt.Errorf("parse YAML: %w", err)
	}
	if err := protojson.Unmarshal(j, m); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}

// EnsureDefaults creates the default capabilities and task profiles that
// the store does not hold yet, on a registry's first start (and when a
// later V0M3 version adds one). An existing definition is never
// overwritten, whoever wrote it and whatever its state: a platform team's
// revision or deprecation of a default wins over what V0M3 ships. Several
// replicas may run it at once: creation is create-if-absent.
func (s *Server) EnsureDefaults(ctx context.Context) error {
	caps, err := DefaultCapabilities()
	if err != nil {
		return err
	}
	profiles, err := DefaultTaskProfiles()
	if err != nil {
		return err
	}
	by := identity.ServiceURI("registry")
	created := 0
	for _, c := range caps {
		_, err := s.st.GetCapability(ctx, c.GetName(), 0)
		if err == nil {
			continue
		}
		if !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("default capability %s: %w", c.GetName(), err)
		}
		err = s.st.CreateCapability(ctx, s.stamp(c, by), []*registryv1.RegistryEvent{s.definitionEvent(
			registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_CAPABILITY_REVISED, c.GetName(),
			fmt.Sprintf("default capability %s declared at revision 1 (input schema %s)", c.GetName(), c.GetInputSchemaDigest()))})
		switch {
		case err == nil:
			created++
		case !errors.Is(err, store.ErrExists): // another replica was first otherwise
			return fmt.Errorf("default capability %s: %w", c.GetName(), err)
		}
	}
	// Profiles come second: they name capabilities.
	for _, p := range profiles {
		_, err := s.st.GetTaskProfile(ctx, p.GetName(), 0)
		if err == nil {
			continue
		}
		if !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("default task profile %s: %w", p.GetName(), err)
		}
		err = s.st.CreateTaskProfile(ctx, s.stampProfile(p, by), []*registryv1.RegistryEvent{s.definitionEvent(
			registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_PROFILE_REVISED, p.GetName(),
			fmt.Sprintf("default task profile %s declared at revision 1", p.GetName()))})
		switch {
		case err == nil:
			created++
		case !errors.Is(err, store.ErrExists):
			return fmt.Errorf("default task profile %s: %w", p.GetName(), err)
		}
	}
	if created > 0 {
		s.notify()
		s.log.InfoContext(ctx, "default definitions declared", "created", created, "managed_by", ManagedByDefaults)
	}
	return nil
}

// stamp makes c revision 1, active, created now by by.
func (s *Server) stamp(c *registryv1.Capability, by string) *registryv1.Capability {
	c.Revision, c.State, c.CreateTime, c.CreatedBy = 1, registryv1.DefinitionState_DEFINITION_STATE_ACTIVE, s.timestamp(), by
	return c
}

func (s *Server) stampProfile(p *registryv1.TaskProfile, by string) *registryv1.TaskProfile {
	p.Revision, p.State, p.CreateTime, p.CreatedBy = 1, registryv1.DefinitionState_DEFINITION_STATE_ACTIVE, s.timestamp(), by
	return p
}
