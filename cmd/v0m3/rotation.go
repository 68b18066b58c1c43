package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/v0m3/v0m3/internal/identity"
	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// runRotation prints the credential rotation state of every MCPServer: the
// config revision serving and the latest one, the rollout's progress
// (pods of the current template available / desired), the credential
// version, the latest rotation's state and, with --token, how many
// approvals waiting for a person were invalidated by a rotation.
func runRotation(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("rotation", stderr)
	namespace := fs.String("namespace", "", "only this namespace; empty lists all namespaces")
	wait := fs.Bool("wait", false, "wait until every listed server's credentials are current (its latest rotation rolled out and serves); exit non-zero at once when a rotation failed, or if they are not current within --timeout")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait, how long to wait")
	orch := addOrchestratorFlags(fs)
	kube := addKubeFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	// The cluster first: without one there is nothing to show, and the
	// person learns that before anything else is dialled.
	target, err := kube.config()
	if err != nil {
		return err
	}
	count, closeOrch, err := orch.counter(ctx)
	if err != nil {
		return err
	}
	defer closeOrch()
	show := func(servers []v1alpha1.MCPServer) error {
		var counts map[string]int
		if count != nil {
			c, err := count(servers)
			if err != nil {
				return err
			}
			counts = c
		}
		return printRotation(stdout, servers, counts, time.Now())
	}
	scheme, err := operatorScheme()
	if err != nil {
		return err
	}
	c, err := client.New(target.cfg, client.Options{Scheme: scheme})
	if err != nil {
		return explainListError(target, err)
	}
	list := func(ctx context.Context) ([]v1alpha1.MCPServer, error) {
		var l v1alpha1.MCPServerList
		if err := c.List(ctx, &l, client.InNamespace(*namespace)); err != nil {
			return nil, explainListError(target, err)
		}
		return l.Items, nil
	}
	if !*wait {
		servers, err := list(ctx)
		if err != nil {
			return err
		}
		return show(servers)
	}
	wctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	// The final table is counted under ctx: a wait that timed out still
	// shows what was invalidated.
	return waitRotation(wctx, list, 2*time.Second, show)
}

// waitRotation lists servers every interval until none is rotating, then
// prints the table and returns nil. When a rotation failed it prints the
// table and returns an error naming the servers and why; when ctx ends
// first, one naming the servers still rotating. A script's exit code says
// whether the rotation completed.
func waitRotation(ctx context.Context, list func(context.Context) ([]v1alpha1.MCPServer, error), interval time.Duration, show func([]v1alpha1.MCPServer) error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last []v1alpha1.MCPServer
	for {
		servers, err := list(ctx)
		switch {
		case err == nil:
			last = servers
			if failed := failedRotations(servers); len(failed) > 0 {
				if perr := show(servers); perr != nil {
					return perr
				}
				return fmt.Errorf("rotation failed, the previous revision keeps serving: %s", strings.Join(failed, "; "))
			}
			if pending := rotating(servers); len(pending) == 0 {
				return show(servers)
			}
		case ctx.Err() == nil:
			return err
		}
		select {
		case <-ctx.Done():
			if perr := show(last); perr != nil {
				return perr
			}
			return fmt.Errorf("rotation not complete: %s still rolling out when the wait ended (%w)", strings.Join(rotating(last), ", "), ctx.Err())
		case <-t.C:
		}
	}
}

// rotating names ("namespace/name") the servers whose latest rotation has
// not completed: a rotation recorded without a completion time, or
// credentials reported as not yet current.
func rotating(servers []v1alpha1.MCPServer) []string {
	var out []string
	for _, s := range servers {
		inProgress := s.Status.Rotation != nil && s.Status.Rotation.CompletionTime == nil && s.Status.Rotation.Failure == ""
		if c := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionCredentialsReady); c != nil && c.Reason == v1alpha1.ReasonRotationInProgress {
			inProgress = true
		}
		if inProgress {
			out = append(out, s.Namespace+"/"+s.Name)
		}
	}
	return out
}

// failedRotations names ("namespace/name: why") the servers whose latest
// rotation failed.
func failedRotations(servers []v1alpha1.MCPServer) []string {
	var out []string
	for _, s := range servers {
		if r := s.Status.Rotation; r != nil && r.CompletionTime == nil && r.Failure != "" {
			out = append(out, fmt.Sprintf("%s/%s: %s", s.Namespace, s.Name, r.Failure))
		}
	}
	return out
}

// printRotation writes one line per MCPServer. invalidated maps a
// connection id to the number of approvals waiting at a revision older
// than the one serving; nil (not counted) prints "-".
func printRotation(w io.Writer, servers []v1alpha1.MCPServer, invalidated map[string]int, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tSERVING\tLATEST\tPODS\tCREDENTIAL\tSTATE\tROTATION\tSTARTED\tCOMPLETED\tINVALIDATED")
	for _, s := range servers {
		state := "-"
		if c := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionCredentialsReady); c != nil {
			state = c.Reason
		}
		rotation, started, completed := "-", "-", "-"
		if r := s.Status.Rotation; r != nil {
			rotation = fmt.Sprintf("%d -> %d", r.FromRevision, r.ToRevision)
			started = now.Sub(r.StartTime.Time).Round(time.Second).String() + " ago"
			switch {
			case r.CompletionTime != nil:
				completed = r.CompletionTime.Sub(r.StartTime.Time).Round(time.Second).String() + " later"
			case r.Failure != "":
				completed = "failed"
			default:
				completed = "in progress"
			}
		}
		cred := s.Status.CredentialVersion
		if cred == "" {
			cred = "-"
		}
		serving, pods := "-", "-"
		if s.Status.ServingConfigRevision > 0 {
			serving = fmt.Sprint(s.Status.ServingConfigRevision)
		}
		if s.Status.DesiredReplicas > 0 {
			pods = fmt.Sprintf("%d/%d", s.Status.UpdatedReadyReplicas, s.Status.DesiredReplicas)
		}
		count := "-"
		if invalidated != nil && s.Status.ConnectionID != "" {
			count = fmt.Sprint(invalidated[s.Status.ConnectionID])
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Namespace, s.Name, serving, s.Status.ConfigRevision, pods, cred, state, rotation, started, completed, count)
	}
	return tw.Flush()
}

// orchestratorFlags are how `v0m3 rotation` reaches the orchestrator as
// the person running it, to count the approvals a rotation invalidated.
type orchestratorFlags struct {
	addr, token, caFile *string
	insecure            *bool
}

func addOrchestratorFlags(fs *flag.FlagSet) *orchestratorFlags {
	return &orchestratorFlags{
		addr: fs.String("orchestrator-addr", defaultAddr("orchestrator"), "orchestrator address, for the INVALIDATED column"),
		token: fs.String("token", "", "your bearer token (V0M3_TOKEN). Without it INVALIDATED shows \"-\": approvals live in the orchestrator, "+
			"which shows a caller only the tasks it may read, so the count covers those tasks (an auditor's covers every task)"),
		caFile:   fs.String("tls-ca-file", "./.v0m3-data/pki/ca.crt", "PEM CA bundle the orchestrator's certificate chains to"),
		insecure: fs.Bool("insecure-plaintext", false, "DEVELOPMENT ONLY: the orchestrator serves plaintext"),
	}
}

// counter returns the function counting invalidated approvals per
// connection, or nil when no token was given (nothing to ask as), and the
// function closing its connection.
func (f *orchestratorFlags) counter(ctx context.Context) (func([]v1alpha1.MCPServer) (map[string]int, error), func(), error) {
	if *f.token == "" {
		return nil, func() {}, nil
	}
	conn, err := dialAs(*f.addr, *f.caFile, *f.insecure, "the orchestrator")
	if err != nil {
		return nil, nil, err
	}
	c := orchestratorv1.NewOrchestratorServiceClient(conn)
	ctx = identity.WithBearer(ctx, *f.token)
	return func(servers []v1alpha1.MCPServer) (map[string]int, error) {
		n, err := countInvalidated(ctx, c, servers)
		if err != nil {
			return nil, fmt.Errorf("count invalidated approvals at the orchestrator %s: %w", *f.addr, err)
		}
		return n, nil
	}, func() { _ = conn.Close() }, nil
}

// countInvalidated counts, per connection id of servers, the requests
// awaiting approval whose approval binds that connection at a config
// revision older than the one its server serves: approving them fails
// naming the credentials binding. It reads every active task the caller
// may see and their waiting requests, all pages; any error is returned,
// never a partial count.
func countInvalidated(ctx context.Context, c orchestratorv1.OrchestratorServiceClient, servers []v1alpha1.MCPServer) (map[string]int, error) {
	serving := map[string]int64{}
	counts := map[string]int{}
	for _, s := range servers {
		if id := s.Status.ConnectionID; id != "" && s.Status.ServingConfigRevision > 0 {
			serving[id] = s.Status.ServingConfigRevision
			counts[id] = 0
		}
	}
	tasks, err := collectPages(ctx, func(ctx context.Context, tok string) ([]*orchestratorv1.Task, string, error) {
		r, err := c.ListTasks(ctx, &orchestratorv1.ListTasksRequest{State: orchestratorv1.TaskState_TASK_STATE_ACTIVE, PageSize: maxPageSize, PageToken: tok})
		return r.GetTasks(), r.GetNextPageToken(), err
	})
	if err != nil {
		return nil, fmt.Errorf("list active tasks: %w", err)
	}
	for _, t := range tasks {
		reqs, err := collectPages(ctx, func(ctx context.Context, tok string) ([]*orchestratorv1.ToolRequest, string, error) {
			r, err := c.ListRequests(ctx, &orchestratorv1.ListRequestsRequest{
				TaskId: t.GetId(), State: orchestratorv1.RequestState_REQUEST_STATE_AWAITING_APPROVAL, PageSize: maxPageSize, PageToken: tok})
			return r.GetRequests(), r.GetNextPageToken(), err
		})
		if err != nil {
			return nil, fmt.Errorf("list the requests of task %s awaiting approval: %w", t.GetId(), err)
		}
		for _, r := range reqs {
			a := r.GetApproval()
			if rev, ok := serving[a.GetConnectionId()]; ok && a.GetConfigRevision() < rev {
				counts[a.GetConnectionId()]++
			}
		}
	}
	return counts, nil
}
