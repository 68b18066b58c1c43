package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/v0m3/v0m3/internal/identity"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// runAudit lists or exports the audit log of privileged actions, as the
// person running it (an auditor).
func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("audit", stderr)
	addr := fs.String("evidence-addr", defaultAddr("evidence"), "evidence service address")
	token := fs.String("token", "", "your bearer token (V0M3_TOKEN); policy lets auditors read the audit log")
	caFile := fs.String("tls-ca-file", "./.v0m3-data/pki/ca.crt", "PEM CA bundle the evidence service's certificate chains to")
	insecure := fs.Bool("insecure-plaintext", false, "DEVELOPMENT ONLY: the evidence service serves plaintext")
	jsonl := fs.Bool("jsonl", false, "print every record as one JSON object per line (export), instead of a table")
	action := fs.String("action", "", "only records of this action, e.g. request.approve")
	principal := fs.String("principal", "", "only records of this principal")
	resource := fs.String("resource", "", "only records of this resource, e.g. connection:con_123")
	pageSize := fs.Int("page-size", 500, "records per request")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *token == "" {
		return usageError{"--token (or V0M3_TOKEN) is required: the evidence service decides who may read the audit log from who your token names"}
	}
	conn, err := dialAs(*addr, *caFile, *insecure, "the evidence service")
	if err != nil {
		return err
	}
	defer conn.Close()
	return exportAudit(identity.WithBearer(ctx, *token), evidencev1.NewEvidenceServiceClient(conn), &evidencev1.ListAuditRecordsRequest{
		PageSize: int32(min(max(*pageSize, 1), 1000)), Action: *action, Principal: *principal, Resource: *resource,
	}, *jsonl, stdout)
}

// exportAudit pages through the audit log and prints every record.
func exportAudit(ctx context.Context, c evidencev1.EvidenceServiceClient, req *evidencev1.ListAuditRecordsRequest, jsonl bool, w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !jsonl {
		fmt.Fprintln(tw, "SEQ\tTIME\tPRINCIPAL\tACTION\tRESOURCE\tREVISION\tOUTCOME")
	}
	enc := protojson.MarshalOptions{UseProtoNames: true}
	for {
		page, err := c.ListAuditRecords(ctx, req)
		if err != nil {
			return fmt.Errorf("list audit records: %w", err)
		}
		for _, r := range page.GetRecords() {
			if jsonl {
				b, err := enc.Marshal(r)
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintf(w, "%s\n", b); err != nil {
					return err
				}
				continue
			}
			// When the action was taken; a record appended late says
			// so in its time, which the JSON export keeps.
			at := r.GetActionTime()
			if at == nil {
				at = r.GetTime()
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.GetSequence(), at.AsTime().Format("2006-01-02T15:04:05Z"),
				r.GetPrincipal(), r.GetAction(), r.GetResource(), r.GetRevision(), r.GetOutcome())
		}
		if page.GetNextPageToken() == "" {
			break
		}
		req.PageToken = page.GetNextPageToken()
	}
	if !jsonl {
		return tw.Flush()
	}
	return nil
}
