// Package receipt owns what makes a receipt believable: the adapter's
// attestation of what it observed for one attempt (the response digest and
// the artifact digest and delivery id the result carried), signed with the
// adapter's service certificate, and the rule that a receipt is trusted
// only with an attestation that names the same intent, task, attempt,
// artifact and delivery. Evidence checks it before storing a receipt; the
// orchestrator checks it again before trusting one it reads back.
package receipt

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/identity"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
)

// Type names the payload, so no other signed statement passes for one.
const Type = "v0m3.receipt-attestation/v1"

// Reasons a receipt is not believed (google.rpc.ErrorInfo reasons).
const (
	// ReasonMissing: the receipt carries no attestation.
	ReasonMissing = "RECEIPT_ATTESTATION_MISSING"
	// ReasonInvalid: the attestation is not signed by the adapter.
	ReasonInvalid = "RECEIPT_ATTESTATION_INVALID"
	// ReasonMismatch: the attestation names another intent, task,
	// attempt, artifact or delivery than the receipt.
	ReasonMismatch = "RECEIPT_ATTESTATION_MISMATCH"
)

// Result fields of a tool's structured content that are evidence of an
// effect: the one place that says where a receipt's facts come from.
const (
	FieldArtifactDigest = "artifact_digest"
	FieldDeliveryID     = "delivery_id"
)

// Fields returns the artifact digest and delivery id a result's
// structured content carries ("" when absent).
func Fields(structured *structpb.Struct) (artifact, delivery string) {
	f := structured.GetFields()
	return f[FieldArtifactDigest].GetStringValue(), f[FieldDeliveryID].GetStringValue()
}

// Attestation is the signed payload.
type Attestation struct {
	Type           string `json:"typ"`
	GrantID        string `json:"grant_id"`
	AttemptID      string `json:"attempt_id"`
	IntentID       string `json:"intent_id"`
	TaskID         string `json:"task_id"`
	ResponseDigest string `json:"response_digest"`
	ArtifactDigest string `json:"artifact_digest,omitempty"`
	DeliveryID     string `json:"delivery_id,omitempty"`
	// ObservedAt is when the adapter observed the result, Unix seconds.
	ObservedAt int64 `json:"observed_at"`
}

// Error is a receipt that is not believed, with its reason and, for a
// mismatch, the field.
type Error struct {
	Reason string
	Field  string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

func refused(reason, field, format string, args ...any) *Error {
	return &Error{Reason: reason, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Attest returns the adapter's attestation of one observed result, signed
// with its credentials.
func Attest(creds *identity.Credentials, a Attestation, observed time.Time) (string, error) {
	if creds == nil {
		return "", errors.New("receipt: no credentials to sign with")
	}
	a.Type = Type
	a.ObservedAt = observed.Unix()
	payload, err := json.Marshal(a)
	if err != nil {
		return "", fmt.Errorf("receipt: %w", err)
	}
	return creds.Sign(payload)
}

// Verify checks token: signed by the adapter service under the CA creds
// trusts, and an attestation. It returns the attestation or an *Error.
func Verify(creds *identity.Credentials, token string) (Attestation, error) {
	if token == "" {
		return Attestation{}, refused(ReasonMissing, "attestation", "the receipt carries no attestation from the adapter")
	}
	payload, err := creds.Verify(token, identity.Adapter)
	if err != nil {
		return Attestation{}, refused(ReasonInvalid, "attestation", "the receipt attestation is not signed by the adapter: %v", err)
	}
	var a Attestation
	if err := json.Unmarshal(payload, &a); err != nil || a.Type != Type || a.AttemptID == "" {
		return Attestation{}, refused(ReasonInvalid, "attestation", "the signed statement is not a receipt attestation")
	}
	return a, nil
}

// Check verifies rc's attestation and that it attests exactly rc: the same
// intent (idempotency key), task, attempt, artifact digest and delivery
// id. It returns the attestation or an *Error.
func Check(creds *identity.Credentials, rc *evidencev1.Receipt) (Attestation, error) {
	a, err := Verify(creds, rc.GetAttestation())
	if err != nil {
		return Attestation{}, err
	}
	for _, f := range []struct{ name, want, have string }{
		{"idempotency_key", a.IntentID, rc.GetIdempotencyKey()},
		{"task_id", a.TaskID, rc.GetTaskId()},
		{"attempt_id", a.AttemptID, rc.GetAttemptId()},
		{"artifact_digest", a.ArtifactDigest, rc.GetArtifactDigest()},
		{"delivery_id", a.DeliveryID, rc.GetDeliveryId()},
	} {
		if f.want != f.have {
			return Attestation{}, refused(ReasonMismatch, f.name, "the receipt's %s is not what the adapter attested for attempt %s", f.name, a.AttemptID)
		}
	}
	return a, nil
}
