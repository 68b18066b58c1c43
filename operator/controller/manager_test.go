package controller_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	"github.com/v0m3/v0m3/operator/controller"
)

// waitFor polls until cond holds. The deadline only bounds a broken run;
// nothing asserts how long the operator takes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Under a running manager, the wiring does the work: the MCPServer is
// registered on its own, Events are recorded, and updating the Secret (seen
// through the metadata-only watch and the field index) rotates the
// credential into a new config revision.
func TestManagerRotatesOnSecretChange(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:     scheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{f.ns: {}}},
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		t.Fatalf("manager: %v", err)
	}
	r := &controller.Reconciler{
		Client:   mgr.GetClient(),
		Scheme:   scheme,
		Registry: registry,
		Events:   mgr.GetEventRecorder("v0m3-operator"),
		Options:  f.r.Options,
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		t.Fatalf("setup: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	sec := f.secret("search-token", "first")
	f.create(f.stdioServer("search"))
	var s v1alpha1.MCPServer
	waitFor(t, "registration at revision 1", func() bool {
		return k8s.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "search"}, &s) == nil && s.Status.ConfigRevision == 1
	})

	sec.StringData = map[string]string{"token": "second"}
	if err := k8s.Update(f.ctx, sec); err != nil {
		t.Fatalf("rotate Secret: %v", err)
	}
	waitFor(t, "config revision 2 after the rotation", func() bool {
		return k8s.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "search"}, &s) == nil && s.Status.ConfigRevision == 2
	})
	if s.Status.CredentialVersion != "search-token@"+sec.ResourceVersion || s.Status.Rotation == nil {
		t.Errorf("status credential %q rotation %+v; want the new Secret version in progress", s.Status.CredentialVersion, s.Status.Rotation)
	}

	waitFor(t, "a Registered event", func() bool {
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
