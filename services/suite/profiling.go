package suite

import (
	"context"
	"log/slog"
	"net"

	"github.com/v0m3/v0m3/services/internal/serve"
)

// ServeProfiles serves Go runtime profiles on a loopback address of their
// own until ctx ends (see serve.Profiling); the commands' --pprof flag,
// off by default, calls it.
func ServeProfiles(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	return serve.Profiling(ctx, addr, log)
}
