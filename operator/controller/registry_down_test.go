package controller_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// With the registry unreachable, the reconcile fails (so the rate limiter
// backs off), says why in Ready, and does not start pods whose
// configuration the registry has not recorded.
func TestRegistryUnavailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// A port that was listening a moment ago and no longer is.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f.r.Registry = registryv1.NewRegistryServiceClient(conn)

	f.secret("search-token", "t")
	f.create(f.stdioServer("search"))
	_, err = f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: f.ns, Name: "search"}})
	if err == nil {
		t.Fatalf("reconcile succeeded with the registry down; want an error so it is retried with backoff")
	}
	s := f.server("search")
	if c := f.condition(s, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonRegistryUnavailable {
		t.Errorf("Ready = %s/%s; want False/RegistryUnavailable", c.Status, c.Reason)
	}
	if err := k8s.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "search"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("Deployment get = %v; want none before the registry records the config", err)
	}
	if !f.events.has(v1alpha1.ReasonRegistryUnavailable) {
		t.Errorf("events = %v; want RegistryUnavailable", f.events.events)
	}
}

// With the registry unreachable, a Capability's reconcile fails so the
// rate limiter retries with backoff (unlike a refusal, which waits for a
// new spec), and its conditions say the registry is unavailable rather
// than that the spec is wrong.
func TestCapabilityRegistryUnavailable(t *testing.T) {
	t.Parallel()
	f := newDefFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f.caps.Registry = registryv1.NewRegistryServiceClient(conn)

	f.create(projectFileCapability(t, "read-while-down"))
	if _, err := f.caps.Reconcile(f.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: "read-while-down"}}); err == nil {
		t.Fatalf("reconcile succeeded with the registry down; want an error so it is retried with backoff")
	}
	c := f.capability("read-while-down")
	for _, typ := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionReady} {
		if got := cond(c.Status.Conditions, typ); got.Status != metav1.ConditionUnknown || got.Reason != v1alpha1.ReasonRegistryUnavailable {
			t.Errorf("%s = %s/%s; want Unknown/RegistryUnavailable", typ, got.Status, got.Reason)
		}
	}
	if c.Status.Refusal != nil || c.Status.Revision != 0 {
		t.Errorf("status = %+v; want no refusal and no revision", c.Status)
	}
	if !f.events.has(v1alpha1.ReasonRegistryUnavailable) {
		t.Errorf("events = %v; want RegistryUnavailable", f.events.events)
	}

	// Once the registry answers again, the same resource is declared.
	f.caps.Registry = registry
	f.reconcileCap("read-while-down")
	if a := cond(f.capability("read-while-down").Status.Conditions, v1alpha1.ConditionAccepted); a.Status != metav1.ConditionTrue {
		t.Errorf("Accepted after the registry came back = %+v; want True", a)
	}
}
