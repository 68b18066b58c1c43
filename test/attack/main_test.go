package attack_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/v0m3/v0m3/internal/testkit"
	"github.com/v0m3/v0m3/suite"

	"github.com/v0m3/v0m3/services/adapter"
)

// fixtureBin is the fixture MCP server and v0m3Bin the real binary (the
// renderer's executable and the orchestrator process a test kills), built
// once, in a directory only this user can write to (an executable anyone
// could replace is never started).
var fixtureBin, v0m3Bin string

func TestMain(m *testing.M) {
	// The in-process adapter re-executes this test binary as the sandbox
	// launcher of each local server it starts.
	if adapter.IsSandboxLaunch() {
		adapter.RunSandboxLaunch()
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	bins, cleanup, err := testkit.BuildBinaries("github.com/v0m3/v0m3/demo/fixture/fixturecmd", "github.com/v0m3/v0m3/cmd/v0m3")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	fixtureBin, v0m3Bin = bins[0], bins[1]
	return m.Run()
}

// start runs the five services with the development identity: an
// ephemeral CA, a certificate per service, and a token issuer for people.
// The adapter may start executables from /usr/bin (where /bin/sh lies)
// and the fixture's directory, and reach loopback servers: what the
// attacks below use is allowed by reachability, so only review stops them.
func start(t *testing.T) *suite.Suite {
	t.Helper()
	s, err := suite.Start(context.Background(), suite.Config{
		DataDir: t.TempDir(),
		Reach:   &suite.Reach{StdioRoots: []string{"/usr/bin", "/bin", filepath.Dir(fixtureBin)}, AllowLoopback: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// peers returns clients that call as the V0M3 service name, with its
// certificate.
func peers(t *testing.T, s *suite.Suite, name string) suite.Clients {
	t.Helper()
	c, err := s.PeerClients(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// person is someone acting with a verified token.
type person struct {
	ID     string
	Groups []string
}

var (
	// pat installs servers and is also a reviewer: separation of duties
	// must stop pat from reviewing what pat proposed.
	pat = person{"pat@platform", []string{"platform", "reviewers"}}
	// ivan installs servers.
	ivan = person{"ivan@platform", []string{"platform"}}
	// rita reviews.
	rita = person{"rita@review", []string{"reviewers"}}
	// alice is an author.
	alice = person{"alice", []string{"authors"}}
)
