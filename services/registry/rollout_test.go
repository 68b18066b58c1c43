package registry_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// rotateKeepingServing rotates conn's credential (version only, same
// scope) as the operator does: the new revision waits for its rollout.
func rotateKeepingServing(t *testing.T, c registryv1.RegistryServiceClient, conn *registryv1.Connection, version string) *registryv1.Connection {
	t.Helper()
	out, err := c.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), Transport: conn.GetTransport(),
		CredentialScope: conn.GetCredentialScope(), CredentialVersion: version, Reason: "credential rotation", KeepServing: true,
	})
	if err != nil {
		t.Fatalf("rotate keeping serving: %v", err)
	}
	return out
}

// A rotation made with keep_serving leaves the previous revision serving
// (mappings active, approvals still bound to it) until the rollout of the
// new revision is reported ready; a failed rollout is recorded with why
// and changes nothing else; a later revision clears the failure.
func TestReportRollout(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn, _, m := activeSetup(t, r.client)
	conn = reviewConn(t, r.client, conn, true)
	// The operator's connections carry no credential_ref: the credential
	// lives in the pods.
	conn, err := r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), Transport: conn.GetTransport(),
		CredentialScope: conn.GetCredentialScope(), CredentialVersion: "secret@1",
	})
	if err != nil {
		t.Fatal(err)
	}
	first := conn.GetConfigRevision()
	if conn.GetServingConfigRevision() != first {
		t.Fatalf("serving %d after an update without keep_serving, want %d", conn.GetServingConfigRevision(), first)
	}

	rotated := rotateKeepingServing(t, r.client, conn, "secret@2")
	if rotated.GetConfigRevision() != first+1 || rotated.GetServingConfigRevision() != first {
		t.Fatalf("after a rotation keeping serving: latest %d serving %d; want %d serving %d",
			rotated.GetConfigRevision(), rotated.GetServingConfigRevision(), first+1, first)
	}
	if _, err := r.client.ResolveMapping(t.Context(), &registryv1.ResolveMappingRequest{Capability: m.GetCapability(), MappingId: m.GetId()}); err != nil {
		t.Errorf("mapping during the rollout: %v; want still active", err)
	}

	// Refusals change nothing.
	for _, tc := range []struct {
		name   string
		req    *registryv1.ReportRolloutRequest
		code   codes.Code
		reason string
	}{
		{"stale revision", &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: first, Ready: true}, codes.FailedPrecondition, "CONFIG_REVISION_NOT_LATEST"},
		{"future revision", &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: first + 5, Ready: true}, codes.FailedPrecondition, "CONFIG_REVISION_NOT_LATEST"},
		{"no revision", &registryv1.ReportRolloutRequest{Id: conn.GetId(), Ready: true}, codes.InvalidArgument, "FIELD_INVALID"},
		{"failure without a reason", &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: first + 1}, codes.InvalidArgument, "FIELD_INVALID"},
		{"unknown connection", &registryv1.ReportRolloutRequest{Id: "conn_missing", ConfigRevision: 1, Ready: true}, codes.NotFound, "CONNECTION_UNKNOWN"},
	} {
		_, err := r.client.ReportRollout(t.Context(), tc.req)
		wantErr(t, err, tc.code, tc.reason)
	}
	if got := getConn(t, r.client, conn.GetId()); got.GetServingConfigRevision() != first || got.GetRolloutFailure() != nil {
		t.Fatalf("refused reports changed the connection: serving %d failure %v", got.GetServingConfigRevision(), got.GetRolloutFailure())
	}

	failed, err := r.client.ReportRollout(t.Context(), &registryv1.ReportRolloutRequest{
		Id: conn.GetId(), ConfigRevision: first + 1, Detail: "ProgressDeadlineExceeded: ReplicaSet search-2 has timed out progressing"})
	if err != nil {
		t.Fatalf("report failed rollout: %v", err)
	}
	if failed.GetServingConfigRevision() != first || failed.GetRolloutFailure().GetConfigRevision() != first+1 ||
		!strings.Contains(failed.GetRolloutFailure().GetDetail(), "ProgressDeadlineExceeded") {
		t.Fatalf("after a failed rollout: serving %d failure %v; want %d serving and the failure recorded", failed.GetServingConfigRevision(), failed.GetRolloutFailure(), first)
	}
	wantEvent(t, r.client, conn.GetId(), registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_ROLLOUT_FAILED, "keeps serving")

	// The rollout recovers (the Secret was fixed in place, or the pods
	// came up late): the revision serves and the failure is gone.
	ready, err := r.client.ReportRollout(t.Context(), &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: first + 1, Ready: true})
	if err != nil {
		t.Fatalf("report ready: %v", err)
	}
	if ready.GetServingConfigRevision() != first+1 || ready.GetRolloutFailure() != nil {
		t.Fatalf("after ready: serving %d failure %v; want %d, none", ready.GetServingConfigRevision(), ready.GetRolloutFailure(), first+1)
	}
	wantEvent(t, r.client, conn.GetId(), registryv1.RegistryEventType_REGISTRY_EVENT_TYPE_SERVING_REVISION_CHANGED, "serves")
	again, err := r.client.ReportRollout(t.Context(), &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: first + 1, Ready: true})
	if err != nil || !again.GetUpdateTime().AsTime().Equal(ready.GetUpdateTime().AsTime()) {
		t.Errorf("repeating a ready report: %v (update time %v, was %v); want no change", err, again.GetUpdateTime().AsTime(), ready.GetUpdateTime().AsTime())
	}

	// A newer revision clears an older failure.
	next := rotateKeepingServing(t, r.client, ready, "secret@3")
	if _, err := r.client.ReportRollout(t.Context(), &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: next.GetConfigRevision(), Detail: "rollout not ready within 10m0s"}); err != nil {
		t.Fatal(err)
	}
	after := rotateKeepingServing(t, r.client, getConn(t, r.client, conn.GetId()), "secret@4")
	if after.GetRolloutFailure() != nil || after.GetServingConfigRevision() != first+1 {
		t.Errorf("a newer revision: failure %v serving %d; want the failure cleared, %d serving", after.GetRolloutFailure(), after.GetServingConfigRevision(), first+1)
	}
}

// keep_serving cannot be combined with a credential the adapter resolves
// (it would use the new one while calling it the old revision); a
// revision pending review never serves; a retired connection takes no
// report.
func TestReportRolloutRefusals(t *testing.T) {
	t.Parallel()
	r := start(t)
	conn, _, _ := activeSetup(t, r.client)
	conn = reviewConn(t, r.client, conn, true)
	_, err := r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), Transport: conn.GetTransport(),
		CredentialScope: conn.GetCredentialScope(), CredentialRef: "file:/var/run/secrets/v0m3/other", KeepServing: true,
	})
	wantErr(t, err, codes.InvalidArgument, "INVALID_CONNECTION")
	if got := getConn(t, r.client, conn.GetId()); got.GetConfigRevision() != conn.GetConfigRevision() {
		t.Fatalf("a refused update made revision %d", got.GetConfigRevision())
	}

	// What runs changed: the connection is pending review again.
	moved, err := r.client.UpdateConnection(t.Context(), &registryv1.UpdateConnectionRequest{
		Id: conn.GetId(), ExpectedConfigRevision: conn.GetConfigRevision(), Transport: httpTransport("http://sources-v2.mcp.svc:8080/mcp"),
		CredentialScope: conn.GetCredentialScope(), KeepServing: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.client.ReportRollout(t.Context(), &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: moved.GetConfigRevision(), Ready: true})
	wantErr(t, err, codes.FailedPrecondition, "CONNECTION_NOT_APPROVED")
	if got := getConn(t, r.client, conn.GetId()); got.GetServingConfigRevision() != conn.GetConfigRevision() {
		t.Errorf("serving %d after a refused report, want %d", got.GetServingConfigRevision(), conn.GetConfigRevision())
	}

	if _, err := r.client.RetireConnection(t.Context(), &registryv1.RetireConnectionRequest{Id: conn.GetId()}); err != nil {
		t.Fatal(err)
	}
	_, err = r.client.ReportRollout(t.Context(), &registryv1.ReportRolloutRequest{Id: conn.GetId(), ConfigRevision: moved.GetConfigRevision(), Detail: "x"})
	wantErr(t, err, codes.FailedPrecondition, "CONNECTION_RETIRED")
}

// wantEvent fails unless the registry's event log holds an event of typ
// for connID whose detail contains want.
func wantEvent(t *testing.T, c registryv1.RegistryServiceClient, connID string, typ registryv1.RegistryEventType, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	stream, err := c.WatchEvents(ctx, &registryv1.WatchEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("no %v event for %s containing %q: %v", typ, connID, want, err)
		}
		if ev.GetType() == typ && ev.GetConnectionId() == connID && strings.Contains(ev.GetDetail(), want) {
			return
		}
	}
}
