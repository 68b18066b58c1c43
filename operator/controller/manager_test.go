package controller_test

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// startManager runs the MCPServer reconciler under a real manager that
// sees only the fixture's namespace, until the test ends.
func (f *fixture) startManager() {
	f.t.Helper()
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:     scheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{f.ns: {}}},
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		f.t.Fatalf("manager: %v", err)
	}
	r := &controller.Reconciler{Client: mgr.GetClient(), Scheme: scheme, Registry: registry, Events: mgr.GetEventRecorder("v0m3-operator"), Options: f.r.Options}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		cancel()
		f.t.Fatalf("setup: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("manager: %v", err)
		}
	})
}

// Under a running manager, the wiring does the work: the MCPServer is
// registered on its own, Events are recorded, and updating the Secret (seen
// through the metadata-only watch and the field index) rotates the
// credential into a new config revision.
func TestManagerRotatesOnSecretChange(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.startManager()

	sec := f.secret("search-token", "first")
	f.create(f.stdioServer("search"))
	var s v1alpha1.MCPServer
	testkit.Eventually(t, "registration at revision 1", func() bool {
		return k8s.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "search"}, &s) == nil && s.Status.ConfigRevision == 1
	})

	sec.StringData = map[string]string{"token": "second"}
	if err := k8s.Update(f.ctx, sec); err != nil {
		t.Fatalf("rotate Secret: %v", err)
	}
	testkit.Eventually(t, "config revision 2 after the rotation", func() bool {
		return k8s.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "search"}, &s) == nil && s.Status.ConfigRevision == 2
	})
	if s.Status.CredentialVersion != "search-token@"+sec.ResourceVersion || s.Status.Rotation == nil {
		t.Errorf("status credential %q rotation %+v; want the new Secret version in progress", s.Status.CredentialVersion, s.Status.Rotation)
	}

	testkit.Eventually(t, "a Registered event", func() bool {
		var list eventsv1.EventList
		if err := k8s.List(f.ctx, &list, client.InNamespace(f.ns)); err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.Reason == "Registered" && e.Regarding.Name == "search" && e.Type == corev1.EventTypeNormal {
				return true
			}
		}
		return false
	})
}

// Under a running manager, a Capability and a TaskProfile that needs it,
// applied together (as kubectl apply -f dir/ or a GitOps sync does),
// both end up declared: the profile, refused while the capability is not
// declared yet, is woken by the Capability's status change rather than
// waiting for its resync. Deleting both deprecates both.
func TestManagerDeclaresDefinitions(t *testing.T) {
	t.Parallel()
	needCluster(t)
	// This manager sees only this test's resources: the other tests
	// reconcile theirs directly and must not race a second reconciler.
	sel := labels.SelectorFromSet(labels.Set{"v0m3.dev/test": "manager-definitions"})
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&v1alpha1.Capability{}:  {Label: sel},
			&v1alpha1.TaskProfile{}: {Label: sel},
		}},
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		t.Fatalf("manager: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rec := mgr.GetEventRecorder("v0m3-operator")
	if err := (&controller.CapabilityReconciler{Client: mgr.GetClient(), Registry: registry, Events: rec}).SetupWithManager(mgr); err != nil {
		t.Fatalf("setup capabilities: %v", err)
	}
	if err := (&controller.TaskProfileReconciler{Client: mgr.GetClient(), Registry: registry, Events: rec}).SetupWithManager(ctx, mgr); err != nil {
		t.Fatalf("setup profiles: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	f := newDefFixture(t)
	label := map[string]string{"v0m3.dev/test": "manager-definitions"}
	p := &v1alpha1.TaskProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "notebook-review", Labels: label},
		Spec:       v1alpha1.TaskProfileSpec{Needs: []v1alpha1.ProfileNeed{{Capability: "read_notebook"}}},
	}
	f.create(p)
	c := projectFileCapability(t, "read-notebook")
	c.Labels = label
	f.create(c)

	testkit.Eventually(t, "the TaskProfile accepted once its capability is declared", func() bool {
		var got v1alpha1.TaskProfile
		return k8s.Get(f.ctx, client.ObjectKey{Name: "notebook-review"}, &got) == nil && got.Status.Revision == 1 &&
			cond(got.Status.Conditions, v1alpha1.ConditionAccepted).Status == metav1.ConditionTrue
	})
	if got := f.registered("read_notebook"); got.GetRevision() != 1 {
		t.Errorf("capability revision %d; want 1", got.GetRevision())
	}
	testkit.Eventually(t, "a Declared event", func() bool {
		var list eventsv1.EventList
		if err := k8s.List(f.ctx, &list); err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.Reason == "Declared" && e.Regarding.Kind == "Capability" && e.Regarding.Name == "read-notebook" {
				return true
			}
		}
		return false
	})

	f.delete(p)
	f.delete(c)
	testkit.Eventually(t, "both resources gone after deprecating their definitions", func() bool {
		return apierrors.IsNotFound(k8s.Get(f.ctx, client.ObjectKey{Name: "notebook-review"}, &v1alpha1.TaskProfile{})) &&
			apierrors.IsNotFound(k8s.Get(f.ctx, client.ObjectKey{Name: "read-notebook"}, &v1alpha1.Capability{}))
	})
	if got := f.registered("read_notebook"); got.GetState() != registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED {
		t.Errorf("capability after deletion = %v; want deprecated", got.GetState())
	}
	if got, err := registry.GetTaskProfile(f.ctx, &registryv1.GetTaskProfileRequest{Name: "notebook_review"}); err != nil ||
		got.GetState() != registryv1.DefinitionState_DEFINITION_STATE_DEPRECATED {
		t.Errorf("profile after deletion = %v, %v; want deprecated", got, err)
	}
}

// Under a running manager, the operator follows the registry's events: a
// discovery snapshot recorded after the operator has settled the server
// turns Discovered True without waiting for the two-minute resync (this
// test gives up after one minute).
func TestManagerFollowsRegistryEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.startManager()

	f.secret("search-token", "first")
	f.create(f.stdioServer("notes"))
	var s v1alpha1.MCPServer
	testkit.Eventually(t, "registration", func() bool {
		return k8s.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "notes"}, &s) == nil && s.Status.ConnectionID != ""
	})
	f.approve("notes")
	// The operator applies the Deployment once it sees the approval; from
	// then on, without registry events, it would look again only at its
	// resync.
	testkit.Eventually(t, "the Deployment after approval", func() bool {
		var d appsv1.Deployment
		return k8s.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "notes"}, &d) == nil
	})
	testkit.Eventually(t, "Discovered False while nothing was discovered", func() bool {
		return k8s.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "notes"}, &s) == nil &&
			conditionIs(s.Status.Conditions, v1alpha1.ConditionDiscovered, metav1.ConditionFalse)
	})

	adapterPeer, err := services.PeerClients(identity.Adapter)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adapterPeer.Registry.RecordSnapshot(f.ctx, &registryv1.RecordSnapshotRequest{Snapshot: &registryv1.DiscoverySnapshot{
		ConnectionId: s.Status.ConnectionID, ConfigRevision: s.Status.ConfigRevision,
		ServerInfo: &registryv1.ServerInfo{Name: "notes", Version: "1.0.0"}, ProtocolVersion: "2025-06-18",
		Tools: []*registryv1.ToolIdentity{{Name: "search", Description: "Search notes."}},
	}}); err != nil {
		t.Fatalf("record snapshot: %v", err)
	}
	testkit.Eventually(t, "Discovered True after the snapshot was recorded", func() bool {
		return k8s.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "notes"}, &s) == nil &&
			conditionIs(s.Status.Conditions, v1alpha1.ConditionDiscovered, metav1.ConditionTrue) && s.Status.LatestSnapshotDigest != ""
	})
}

// conditionIs says whether conds holds typ with status st.
func conditionIs(conds []metav1.Condition, typ string, st metav1.ConditionStatus) bool {
	c := meta.FindStatusCondition(conds, typ)
	return c != nil && c.Status == st
}
