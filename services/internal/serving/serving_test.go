package serving_test

import (
	"testing"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/internal/serving"
)

func TestRevision(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		conn *registryv1.Connection
		want int64
	}{
		{"rolling out: the previous revision serves", &registryv1.Connection{ConfigRevision: 3, ServingConfigRevision: 2}, 2},
		{"rolled out", &registryv1.Connection{ConfigRevision: 3, ServingConfigRevision: 3}, 3},
		{"recorded before serving revisions", &registryv1.Connection{ConfigRevision: 4}, 4},
		{"no connection", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := serving.Revision(tc.conn); got != tc.want {
				t.Errorf("Revision = %d, want %d", got, tc.want)
			}
		})
	}
}
