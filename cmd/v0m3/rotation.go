package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
)

// runRotation prints the credential rotation state of every MCPServer: the
// config revision in force, the credential version, and the latest
// rotation's progress.
func runRotation(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("rotation", stderr)
	namespace := fs.String("namespace", "", "only this namespace; empty lists all namespaces")
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
	var list v1alpha1.MCPServerList
	if err := c.List(ctx, &list, client.InNamespace(*namespace)); err != nil {
		return fmt.Errorf("list MCPServers: %w", err)
	}
	return printRotation(stdout, list.Items, time.Now())
}

// printRotation writes one line per MCPServer.
func printRotation(w io.Writer, servers []v1alpha1.MCPServer, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tREVISION\tCREDENTIAL\tSTATE\tROTATION\tSTARTED\tCOMPLETED")
	for _, s := range servers {
		state := "-"
		if c := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionCredentialsReady); c != nil {
			state = c.Reason
		}
		rotation, started, completed := "-", "-", "-"
		if r := s.Status.Rotation; r != nil {
			rotation = fmt.Sprintf("%d -> %d", r.FromRevision, r.ToRevision)
			started = now.Sub(r.StartTime.Time).Round(time.Second).String() + " ago"
			if r.CompletionTime != nil {
				completed = r.CompletionTime.Sub(r.StartTime.Time).Round(time.Second).String() + " later"
			} else {
				completed = "in progress"
			}
		}
		cred := s.Status.CredentialVersion
		if cred == "" {
			cred = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Namespace, s.Name, s.Status.ConfigRevision, cred, state, rotation, started, completed)
	}
	return tw.Flush()
}
