package realnode_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/v0m3/v0m3/operator/controller"
)

// The operator registers each server at its Service's cluster DNS name
// (name.namespace.svc.cluster.local). The node runs neither cluster DNS nor
// kube-proxy, and the adapter runs on the host, so the tests stand in for
// both: every half second the ready addresses of each MCPServer Service's
// EndpointSlices (what kube-proxy would route the Service to) are written
// to a marked block of /etc/hosts, which the host resolver (Go's or libc's)
// reads. The pod addresses are on the CNI bridge, which the host routes
// to. The block is removed when the tests end; scripts/realnode.sh down
// removes it too, should a test binary die first.
const (
	hostsFile  = "/etc/hosts"
	hostsBegin = "# v0m3-realnode begin: MCPServer Services (scripts/realnode.sh down removes this)"
	hostsEnd   = "# v0m3-realnode end"
)

func startResolver() error {
	if err := writeHosts(nil); err != nil {
		return fmt.Errorf("%s: %w", hostsFile, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		var last []string
		for {
			if lines, err := serviceHosts(ctx); err == nil && !slices.Equal(lines, last) {
				if err := writeHosts(lines); err != nil {
					fmt.Fprintln(os.Stderr, "realnode resolver:", err)
				} else {
					last = lines
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	teardown = append(teardown, func() {
		cancel()
		<-done
		if err := removeHostsBlock(); err != nil {
			loud("could not remove the v0m3-realnode block from "+hostsFile+": "+err.Error(), "scripts/realnode.sh down removes it")
		}
	})
	return nil
}

// serviceHosts returns one hosts line per MCPServer Service with a ready
// endpoint, sorted.
func serviceHosts(ctx context.Context) ([]string, error) {
	var list discoveryv1.EndpointSliceList
	if err := k8s.List(ctx, &list, client.HasLabels{controller.LabelServer}); err != nil {
		return nil, err
	}
	var lines []string
	for _, s := range list.Items {
		svc := s.Labels[discoveryv1.LabelServiceName]
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready && len(e.Addresses) > 0 {
				lines = append(lines, fmt.Sprintf("%s %s.%s.svc.cluster.local", e.Addresses[0], svc, s.Namespace))
				break
			}
		}
	}
	slices.Sort(lines)
	return lines, nil
}

// writeHosts replaces the marked block with lines. The file is rewritten
// in place, not renamed over: /etc/hosts may be a bind mount.
func writeHosts(lines []string) error {
	b, err := os.ReadFile(hostsFile)
	if err != nil {
		return err
	}
	kept := withoutBlock(string(b))
	block := append(append([]string{hostsBegin}, lines...), hostsEnd)
	return os.WriteFile(hostsFile, []byte(kept+strings.Join(block, "\n")+"\n"), 0o644)
}

func removeHostsBlock() error {
	b, err := os.ReadFile(hostsFile)
	if err != nil {
		return err
	}
	if kept := withoutBlock(string(b)); kept != string(b) {
		return os.WriteFile(hostsFile, []byte(kept), 0o644)
	}
	return nil
}

// withoutBlock returns hosts without the marked block.
func withoutBlock(hosts string) string {
	var out []string
	in := false
	for _, l := range strings.SplitAfter(hosts, "\n") {
		switch {
		case strings.HasPrefix(l, "# v0m3-realnode begin"):
			in = true
		case in && strings.HasPrefix(l, hostsEnd):
			in = false
		case !in && l != "":
			out = append(out, l)
		}
	}
	s := strings.Join(out, "")
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s
}

// resolves waits until the server's Service name resolves, in this process
// (where the adapter runs), to the pod's address: the endpoint controller,
// the resolver loop above and the host resolver's /etc/hosts cache each add
// a little delay after the pod turns Ready.
func (s *server) resolves(pod *corev1.Pod) {
	s.t.Helper()
	name := fmt.Sprintf("%s.%s.svc.cluster.local", s.name, s.ns)
	waitFor(s.t, name+" resolving to "+pod.Status.PodIP, time.Minute, func() (bool, string) {
		addrs, err := net.DefaultResolver.LookupHost(s.ctx, name)
		if err != nil {
			return false, err.Error()
		}
		return slices.Contains(addrs, pod.Status.PodIP), strings.Join(addrs, ",")
	})
}
