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
