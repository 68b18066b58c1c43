package adapter

import (
	"testing"

	"github.com/v0m3/v0m3/internal/serve"
)

// TestLargestResultFitsEveryHop: the largest result a mapping may allow,
// with room for its envelope, fits the message size every V0M3 server and
// client accepts, so a result the mapping allows is never lost to a gRPC
// size limit on its way to the orchestrator and evidence.
func TestLargestResultFitsEveryHop(t *testing.T) {
	t.Parallel()
	const envelope = 1 << 20
	if maxResponseBytesCap+envelope > serve.MaxMessageBytes {
		t.Fatalf("a mapping may allow %d bytes, but gRPC messages are bounded at %d", maxResponseBytesCap, serve.MaxMessageBytes)
	}
}
