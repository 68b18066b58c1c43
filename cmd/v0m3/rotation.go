package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
)

// runRotation prints the credential rotation state of every MCPServer: the
// config revision serving and the latest one, the rollout's progress
// (pods of the current template available / desired), the credential
// version, and the latest rotation's state.
func runRotation(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("rotation", stderr)
	namespace := fs.String("namespace", "", "only this namespace; empty lists all namespaces")
	wait := fs.Bool("wait", false, "wait until every listed server's credentials are current (its latest rotation rolled out and serves); exit non-zero at once when a rotation failed, or if they are not current within --timeout")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait, how long to wait")
	if err := parse(fs, args); err != nil {
		return err
	}
	scheme, err := operatorScheme()
	if err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	list := func(ctx context.Context) ([]v1alpha1.MCPServer, error) {
		var l v1alpha1.MCPServerList
		if err := c.List(ctx, &l, client.InNamespace(*namespace)); err != nil {
			return nil, fmt.Errorf("list MCPServers: %w", err)
		}
		return l.Items, nil
	}
	if !*wait {
		servers, err := list(ctx)
		if err != nil {
			return err
		}
		return printRotation(stdout, servers, time.Now())
	}
	wctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	return waitRotation(wctx, list, 2*time.Second, stdout)
}

// waitRotation lists servers every interval until none is rotating, then
// prints the table and returns nil. When a rotation failed it prints the
// table and returns an error naming the servers and why; when ctx ends
// first, one naming the servers still rotating. A script's exit code says
// whether the rotation completed.
func waitRotation(ctx context.Context, list func(context.Context) ([]v1alpha1.MCPServer, error), interval time.Duration, w io.Writer) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last []v1alpha1.MCPServer
	for {
		servers, err := list(ctx)
		switch {
		case err == nil:
			last = servers
			if failed := failedRotations(servers); len(failed) > 0 {
				if perr := printRotation(w, servers, time.Now()); perr != nil {
					return perr
				}
				return fmt.Errorf("rotation failed, the previous revision keeps serving: %s", strings.Join(failed, "; "))
			}
			if pending := rotating(servers); len(pending) == 0 {
				return printRotation(w, servers, time.Now())
			}
		case ctx.Err() == nil:
			return err
		}
		select {
		case <-ctx.Done():
			if perr := printRotation(w, last, time.Now()); perr != nil {
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

// printRotation writes one line per MCPServer.
func printRotation(w io.Writer, servers []v1alpha1.MCPServer, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tSERVING\tLATEST\tPODS\tCREDENTIAL\tSTATE\tROTATION\tSTARTED\tCOMPLETED")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Namespace, s.Name, serving, s.Status.ConfigRevision, pods, cred, state, rotation, started, completed)
	}
	return tw.Flush()
}
