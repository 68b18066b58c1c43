// Package serving answers which config revision of a registry connection
// serves: the one calls execute at and approvals bind to.
package serving

import (
	"fmt"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// Revision is c's serving config revision. It trails c's latest config
// revision while the workload of a revision created with keep_serving
// rolls out (RegistryService/ReportRollout). A connection recorded before
// the registry kept a serving revision served each revision at once.
func Revision(c *registryv1.Connection) int64 {
	if r := c.GetServingConfigRevision(); r > 0 {
		return r
	}
	return c.GetConfigRevision()
}

// Note says, for a trace, why c's latest config revision does not serve:
// its rollout failed (and why) or is under way. It is "" when it serves.
func Note(c *registryv1.Connection) string {
	latest, rev := c.GetConfigRevision(), Revision(c)
	if latest <= rev {
		return ""
	}
	if f := c.GetRolloutFailure(); f.GetConfigRevision() == latest {
		return fmt.Sprintf("config revision %d did not roll out (%s); revision %d serves", latest, f.GetDetail(), rev)
	}
	return fmt.Sprintf("config revision %d is rolling out; revision %d serves", latest, rev)
}
