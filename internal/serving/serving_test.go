package serving_test

import (
	"strings"
	"testing"

	"github.com/v0m3/v0m3/internal/serving"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
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

func TestNote(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		conn *registryv1.Connection
		want string
	}{
		{"serving the latest", &registryv1.Connection{ConfigRevision: 3, ServingConfigRevision: 3}, ""},
		{"rolling out", &registryv1.Connection{ConfigRevision: 3, ServingConfigRevision: 2}, "config revision 3 is rolling out; revision 2 serves"},
		{"rollout failed", &registryv1.Connection{ConfigRevision: 3, ServingConfigRevision: 2,
			RolloutFailure: &registryv1.RolloutFailure{ConfigRevision: 3, Detail: "ProgressDeadlineExceeded: timed out"}},
			"config revision 3 did not roll out (ProgressDeadlineExceeded: timed out); revision 2 serves"},
		{"an older failure", &registryv1.Connection{ConfigRevision: 4, ServingConfigRevision: 2,
			RolloutFailure: &registryv1.RolloutFailure{ConfigRevision: 3, Detail: "x"}}, "config revision 4 is rolling out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := serving.Note(tc.conn)
			if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
				t.Errorf("Note = %q, want %q", got, tc.want)
			}
		})
	}
}
