package suite_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/suite"
)

// A suite that cannot start says why and releases what it opened; it
// does not panic.
func TestStartFailureIsAnError(t *testing.T) {
	t.Parallel()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Services: []string{"mailer"}})
	if err == nil || s != nil || !strings.Contains(err.Error(), `unknown service "mailer"`) {
		t.Fatalf("Start with an unknown service = %v, %v; want no suite and an error naming it", s, err)
	}
}

// A process that runs one service holds only that service's certificate
// (what `v0m3 orchestrator --tls-*` is given): the suite starts with it
// and serves TLS that callers trusting the CA accept.
func TestStartOneServiceWithOnlyItsCertificate(t *testing.T) {
	t.Parallel()
	ca, err := identity.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	creds, err := ca.Issue(suite.Orchestrator)
	if err != nil {
		t.Fatal(err)
	}
	peers := map[string]string{}
	for _, name := range suite.Names {
		if name != suite.Orchestrator {
			peers[name] = "127.0.0.1:1" // never reached by this test
		}
	}
	s, err := suite.Start(context.Background(), suite.Config{
		DataDir: t.TempDir(), Services: []string{suite.Orchestrator}, Peers: peers,
		Identity: &suite.Identity{Creds: func(service string) (*identity.Credentials, error) {
			if service != suite.Orchestrator {
				return nil, fmt.Errorf("no certificate for %s in this process", service)
			}
			return creds, nil
		}},
	})
	if err != nil {
		t.Fatalf("start the orchestrator alone with its certificate: %v", err)
	}
	t.Cleanup(s.Close)
	conn, err := serve.Dial(s.Addr[suite.Orchestrator], identity.CallerDialOptions(creds.Roots())...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over TLS = %v, %v; want SERVING", resp.GetStatus(), err)
	}
}
