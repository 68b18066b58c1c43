package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/v0m3/v0m3/internal/identity"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

const settleUsage = `Usage:
  v0m3 settle --list
  v0m3 settle REQUEST_ID --attempt ATTEMPT_ID --executed (--artifact-digest D | --receipt-id R | --delivery-id I) --note TEXT
  v0m3 settle REQUEST_ID --attempt ATTEMPT_ID --not-executed --note TEXT

--list shows the requests, across every task, whose outcome is unknown and
that you may settle, with the attempt to examine and since when.

Otherwise settles by hand a request whose outcome is unknown (FAILED /
UNKNOWN), with the evidence you established, at the attempt you examined.
The orchestrator records it, with you as its author, in the request, its
task's events and the trace. Policy decides who may (by default the
settler and admins groups): --token (or V0M3_TOKEN) is your bearer token.

Flags:
`

// runSettle is `v0m3 settle`: SettleRequest as the person running it.
func runSettle(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("settle", stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, settleUsage)
		fs.PrintDefaults()
	}
	addr := fs.String("orchestrator-addr", defaultAddr("orchestrator"), "orchestrator address")
	token := fs.String("token", "", "your bearer token (V0M3_TOKEN)")
	caFile := fs.String("tls-ca-file", "./.v0m3-data/pki/ca.crt", "PEM CA bundle the orchestrator's certificate chains to")
	insecure := fs.Bool("insecure-plaintext", false, "DEVELOPMENT ONLY: the orchestrator serves plaintext")
	attempt := fs.String("attempt", "", "the attempt whose unknown outcome you settle (required)")
	executed := fs.Bool("executed", false, "the effect happened (give its evidence)")
	notExecuted := fs.Bool("not-executed", false, "the effect did not happen")
	artifact := fs.String("artifact-digest", "", "evidence: the artifact digest, sha256:<64 hex>")
	receiptID := fs.String("receipt-id", "", "evidence: the receipt recorded for the request's intent")
	delivery := fs.String("delivery-id", "", "evidence: the delivery id")
	note := fs.String("note", "", "how you established it (required; kept in the trace)")
	list := fs.Bool("list", false, "list the requests awaiting settlement you may settle, across every task")
	// The request id comes first; flags follow it.
	var id string
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		id, args = args[0], args[1:]
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if *list {
		if id != "" || fs.NArg() > 0 || *executed || *notExecuted {
			return usageError{"--list takes no request id and settles nothing"}
		}
		if *token == "" {
			return usageError{"--token (or V0M3_TOKEN) is required: the orchestrator lists what your token's person may settle"}
		}
		conn, err := dialAs(*addr, *caFile, *insecure, "the orchestrator")
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		return listAwaitingSettlement(identity.WithBearer(ctx, *token), orchestratorv1.NewOrchestratorServiceClient(conn), stdout)
	}
	if id == "" || fs.NArg() > 0 {
		fs.Usage()
		return usageError{"settle takes one request id, before the flags"}
	}
	if *executed == *notExecuted {
		return usageError{"say what you established: --executed or --not-executed"}
	}
	if *token == "" {
		return usageError{"--token (or V0M3_TOKEN) is required: the orchestrator decides what you may do from who your token names"}
	}
	in := &orchestratorv1.SettleRequestRequest{RequestId: id, AttemptId: *attempt, Note: *note,
		ArtifactDigest: *artifact, ReceiptId: *receiptID, DeliveryId: *delivery, Settlement: orchestratorv1.Settlement_SETTLEMENT_NOT_EXECUTED}
	if *executed {
		in.Settlement = orchestratorv1.Settlement_SETTLEMENT_EXECUTED
	}
	conn, err := dialAs(*addr, *caFile, *insecure, "the orchestrator")
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	r, err := orchestratorv1.NewOrchestratorServiceClient(conn).SettleRequest(identity.WithBearer(ctx, *token), in)
	if err != nil {
		return rpcError(err)
	}
	fmt.Fprintf(stdout, "request %s settled: %s, outcome %s", r.GetId(), enumWord(r.GetState().String(), "REQUEST_STATE_"), enumWord(r.GetOutcome().String(), "OUTCOME_"))
	if r.GetArtifactDigest() != "" {
		fmt.Fprintf(stdout, ", artifact %s", r.GetArtifactDigest())
	}
	fmt.Fprintln(stdout)
	return nil
}

// listAwaitingSettlement prints, across every task, the requests awaiting
// settlement that the caller may settle: what `v0m3 settle` needs for
// each (the request and attempt ids) and since when its outcome is
// unknown.
func listAwaitingSettlement(ctx context.Context, c orchestratorv1.OrchestratorServiceClient, stdout io.Writer) error {
	rs, err := collectPages(ctx, func(ctx context.Context, token string) ([]*orchestratorv1.ToolRequest, string, error) {
		resp, err := c.ListRequests(ctx, &orchestratorv1.ListRequestsRequest{TaskId: "-", AwaitingSettlement: true, PageSize: maxPageSize, PageToken: token})
		return resp.GetRequests(), resp.GetNextPageToken(), err
	})
	if err != nil {
		return rpcError(err)
	}
	if len(rs) == 0 {
		fmt.Fprintln(stdout, "no request you may settle awaits settlement")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REQUEST\tATTEMPT\tTASK\tCAPABILITY\tUNKNOWN SINCE")
	for _, r := range rs {
		var attempt, since string
		if n := len(r.GetAttempts()); n > 0 {
			a := r.GetAttempts()[n-1]
			attempt = a.GetId()
			if a.GetEndTime() != nil { // else not 1970
				since = a.GetEndTime().AsTime().UTC().Format(time.RFC3339)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.GetId(), attempt, r.GetTaskId(), r.GetCapability(), since)
	}
	return tw.Flush()
}
