package suite_test

import (
	"os"
	"testing"

	"github.com/v0m3/v0m3/services/adapter"
)

// TestMain lets this test binary be the sandbox launcher of the local
// servers its suites' adapters start.
func TestMain(m *testing.M) {
	if adapter.IsSandboxLaunch() {
		adapter.RunSandboxLaunch()
	}
	os.Exit(m.Run())
}
