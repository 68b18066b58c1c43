package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/failpoint"
	"github.com/v0m3/v0m3/internal/reach"
	"github.com/v0m3/v0m3/internal/resultschema"
	"github.com/v0m3/v0m3/internal/serving"
	"github.com/v0m3/v0m3/internal/telemetry"
)

// Execution bounds.
const (
	// maxResponseBytesCap is the largest max_response_bytes a mapping may
	// ask for: the adapter holds up to about this much per call.
	maxResponseBytesCap = 64 << 20
	// defaultExecuteTimeout applies when the caller set no deadline.
	defaultExecuteTimeout = 60 * time.Second
	// maxDetailBytes bounds untrusted detail.
	maxDetailBytes = 512
	// AttemptMetaKey is the _meta key that carries the attempt id in every
	// MCP request, as evidence that links the remote call to the attempt.
	AttemptMetaKey = "dev.v0m3/attempt_id"
)

// Safe codes of ExecuteResponse.error.
const (
	CodeServerUnreachable     = "SERVER_UNREACHABLE"
	CodeToolError             = "TOOL_ERROR"
	CodeResponseLimitExceeded = "RESPONSE_LIMIT_EXCEEDED"
	CodeItemLimitExceeded     = "ITEM_LIMIT_EXCEEDED"
	CodeMediaTypeNotAllowed   = "MEDIA_TYPE_NOT_ALLOWED"
	CodeTransportClosed       = "TRANSPORT_CLOSED"
	CodeDeadlineExceeded      = "DEADLINE_EXCEEDED"
	CodeCancelled             = "CANCELLED"
	CodeMalformedResult       = "MALFORMED_RESULT"
	CodeMalformedMessage      = "MALFORMED_MESSAGE"
	CodeCredentialUnavailable = "CREDENTIAL_UNAVAILABLE"
	CodeAdapterShuttingDown   = "ADAPTER_SHUTTING_DOWN"
	// CodeEndpointNotAllowed, CodeExecutableNotAllowed and CodeEnvNotAllowed
	// are reachability refusals (internal/reach): nothing was
	// started or sent.
	CodeEndpointNotAllowed   = reach.ReasonEndpoint
	CodeExecutableNotAllowed = reach.ReasonExecutable
	CodeEnvNotAllowed        = reach.ReasonEnv
	// CodeSandboxUnavailable: the adapter could not set up a local
	// server's sandbox (data directory, dedicated uid, user namespace), so
	// it did not start the server; the detail says why.
	CodeSandboxUnavailable = "SANDBOX_UNAVAILABLE"
	// CodeNotificationLimitExceeded: the server sent more notifications
	// (or bytes of them) during the call than maxNotificationsPerCall
	// (maxNotificationBytesPerCall) allow, so the adapter cancelled the
	// call; what it did is unknown.
	CodeNotificationLimitExceeded = "NOTIFICATION_LIMIT_EXCEEDED"
	// CodeProtocolVersionUnsupported: the server answered initialize with
	// a protocol version the adapter does not speak; nothing was called.
	CodeProtocolVersionUnsupported = "PROTOCOL_VERSION_UNSUPPORTED"
)

// Execute performs one remote call for an already authorized attempt.
// Request and precondition failures are gRPC errors; from the moment the
// call is prepared, every outcome is an ExecuteResponse carrying the
// furthest delivery stage reached.
//
// Nothing happens without the orchestrator's execution grant for exactly
// this request (see checkGrant): it is verified first, and spent once the
// connection is known to be at the granted config revision, before any
// process starts or any byte is sent.
func (s *Server) Execute(ctx context.Context, req *adapterv1.ExecuteRequest) (*adapterv1.ExecuteResponse, error) {
	g, granted, err := s.checkGrant(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := validateExecute(req); err != nil {
		return nil, err
	}
	schema, err := outputSchema(req)
	if err != nil {
		return nil, err
	}
	conn, err := s.executeConnection(ctx, req)
	if err != nil {
		return nil, err
	}
	if rev := serving.Revision(conn); rev != req.GetConfigRevision() {
		return nil, apierror.New(codes.FailedPrecondition, "CONFIG_REVISION_CHANGED",
			fmt.Sprintf("connection %s serves config revision %d, the call was authorized against %d; authorize it again",
				conn.GetId(), rev, req.GetConfigRevision()),
			map[string]string{
				"connection_id":    conn.GetId(),
				"current_revision": fmt.Sprint(rev),
				"request_revision": fmt.Sprint(req.GetConfigRevision()),
			})
	}
	if granted {
		if err := s.useGrant(ctx, req, g); err != nil {
			return nil, err
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultExecuteTimeout)
		defer cancel()
	}
	method := "tools/call"
	if req.GetTarget().GetKind() == registryv1.RemoteKind_REMOTE_KIND_RESOURCE {
		method = "resources/read"
	}
	ctx, refused := s.exchangeContext(ctx, conn, g, method)
	failpoint.Hit(FailPointSend)
	var (
		resp  *adapterv1.ExecuteResponse
		heard callEvidence
	)
	switch {
	case s.replaying():
		// Replay never falls through to a live call, whatever the
		// transport: a missing fixture is the answer.
		resp = s.replayExecute(ctx, conn, req, schema)
	case refused != nil:
		// A token-exchange connection reached for no requester.
		resp = refused
	case conn.GetTransport().GetDirect() != nil:
		resp = s.executeDirect(ctx, conn, req, schema)
	default:
		resp = s.execute(ctx, conn, req, schema, &heard)
	}
	failpoint.Hit(FailPointResult)
	if s.recording() {
		s.recordExecute(ctx, conn, req, resp)
	}
	if granted {
		s.attest(ctx, g, req, resp)
	}
	// Every call's protocol event goes to evidence; the log tells
	// operators of the calls that did not succeed, and of the others
	// only at debug level (one line per call is the hot path's).
	level := slog.LevelDebug
	if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		level = slog.LevelInfo
	}
	s.log.Log(ctx, level, "executed", "connection_id", conn.GetId(), "attempt_id", req.GetAttemptId(),
		"method", resp.GetMethod(), "outcome", outcomeName(resp.GetOutcome()), "stage", resp.GetStage().String(),
		"safe_code", resp.GetError().GetSafeCode(), "response_bytes", resp.GetResponseBytes())
	s.trace(ctx, req, resp, &heard)
	return resp, nil
}

func validateExecute(req *adapterv1.ExecuteRequest) error {
	var v []apierror.FieldViolation
	add := func(field, desc string) { v = append(v, apierror.FieldViolation{Field: field, Description: desc}) }
	if req.GetConnectionId() == "" {
		add("connection_id", "required")
	}
	if req.GetConfigRevision() <= 0 {
		add("config_revision", "required, > 0")
	}
	if req.GetMappingId() == "" {
		add("mapping_id", "required")
	}
	if req.GetMappingRevision() <= 0 {
		add("mapping_revision", "required, > 0")
	}
	if req.GetAttemptId() == "" {
		add("attempt_id", "required")
	}
	switch t := req.GetTarget(); {
	case t == nil:
		add("target", "required")
	default:
		if t.GetKind() != registryv1.RemoteKind_REMOTE_KIND_TOOL && t.GetKind() != registryv1.RemoteKind_REMOTE_KIND_RESOURCE {
			add("target.kind", "must be REMOTE_KIND_TOOL or REMOTE_KIND_RESOURCE")
		}
		if t.GetName() == "" {
			add("target.name", "required")
		}
		if t.GetKind() == registryv1.RemoteKind_REMOTE_KIND_RESOURCE && len(req.GetArguments().GetFields()) > 0 {
			add("arguments", "must be empty for a resource read")
		}
	}
	switch l := req.GetLimits(); {
	case l == nil:
		add("limits", "required")
	default:
		if l.GetMaxResponseBytes() <= 0 || l.GetMaxResponseBytes() > maxResponseBytesCap {
			add("limits.max_response_bytes", fmt.Sprintf("required, within 1..%d", maxResponseBytesCap))
		}
		if l.GetMaxItems() <= 0 {
			add("limits.max_items", "required, > 0")
		}
	}
	if req.GetOutputSchema() != nil && req.GetTarget().GetKind() == registryv1.RemoteKind_REMOTE_KIND_RESOURCE {
		add("output_schema", "a resource read has no output schema")
	}
	if len(v) > 0 {
		return apierror.InvalidArgument(apierror.ReasonFieldInvalid, "the execute request is incomplete or out of range", v...)
	}
	return nil
}

// outputSchema compiles the request's output schema (the tool's, as
// reviewed with the mapping), nil when there is none. One that cannot be
// compiled fails the request before anything starts: no result could be
// judged by it. The registry refuses such schemas at review, so this
// guards only against a request that did not come from a reviewed
// mapping.
func outputSchema(req *adapterv1.ExecuteRequest) (*resultschema.Schema, error) {
	if req.GetOutputSchema() == nil {
		return nil, nil
	}
	schema, err := resultschema.Compile(req.GetOutputSchema())
	if err != nil {
		return nil, apierror.InvalidArgument("OUTPUT_SCHEMA_INVALID", "the request's output schema cannot validate results",
			apierror.FieldViolation{Field: "output_schema", Description: err.Error()})
	}
	return schema, nil
}

// callEvidence is what the server said during a call besides its
// response, for the protocol trace.
type callEvidence struct {
	progress      []progressNote
	progressCount int64
	answers       []elicitAnswer
}

// execute runs the call and builds its response; schema, when not nil,
// judges a tool result's structured content; heard receives the call's
// progress.
func (s *Server) execute(ctx context.Context, conn *registryv1.Connection, req *adapterv1.ExecuteRequest, schema *resultschema.Schema, heard *callEvidence) *adapterv1.ExecuteResponse {
	method := "tools/call"
	if req.GetTarget().GetKind() == registryv1.RemoteKind_REMOTE_KIND_RESOURCE {
		method = "resources/read"
	}
	resp := &adapterv1.ExecuteResponse{Method: method, Stage: adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED}
	limits := req.GetLimits()
	var (
		toolRes               *mcp.CallToolResult
		readRes               *mcp.ReadResourceResult
		sent, acked, exceeded bool
		sendTime, observed    time.Time
		n                     int64
		err                   error
		authRefused           *authError // the server refused the session's authorization
		st                    *callState
	)
	defer func() {
		heard.progress, heard.progressCount = st.notes()
		heard.answers = st.elicitAnswers()
	}()
	for attempt := 1; ; attempt++ {
		var (
			e       *pooled
			ss      *session
			flooded bool
		)
		e, ss, err = s.pool.acquire(ctx, conn)
		if err != nil {
			if ss == nil {
				ss = &session{m: newMeter(0)}
			}
			s.log.Warn("execute: connect failed", "connection_id", conn.GetId(), "attempt_id", req.GetAttemptId(), "error", logText(err))
			var ce *credentialError
			var cr *credentialRefusedError
			switch re := refusal(err, ss.m); {
			case errors.As(err, &cr):
				return failFact(resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, CodeCredentialRefNotAllowed, cr.Error())
			case errors.Is(err, errBusy):
				return failFact(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeConnectionBusy, busyDetail(conn, s.pool.cfg.MaxCallsPerConnection))
			case re != nil:
				return failFact(resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, re.Reason, re.Detail)
			case authFailure(err, ss.m) != nil:
				return authFailure(err, ss.m).executeFailure(resp)
			case isLimitError(err, ss.m):
				return failFact(resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeResponseLimitExceeded, limitDetail(limits))
			case errors.As(err, &ce):
				return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeCredentialUnavailable, "")
			case errors.Is(err, errAdapterClosed):
				return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeAdapterShuttingDown, "")
			case unsupportedVersion(err) != nil:
				pv := unsupportedVersion(err)
				resp = failFact(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeProtocolVersionUnsupported, pv.fact())
				resp.Error.UntrustedDetail = pv.version
				return resp
			case isSandboxSetup(err):
				// The adapter's own account of its host or configuration.
				return failFact(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeSandboxUnavailable, err.Error())
			case ctx.Err() != nil:
				return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeDeadlineExceeded, "")
			}
			return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeServerUnreachable, "")
		}

		resp.ServerInfo = serverInfo(ss)

		// The call's own limit: the session's bound rises to it before the
		// request is written, and its response is checked against it
		// exactly.
		cm := ss.m.register(method, req.GetAttemptId(), limits.GetMaxResponseBytes()+envelopeAllowance)
		st = ss.calls.begin(limits.GetElicitation())
		callCtx, cancelCall := context.WithCancel(withCallState(ctx, st))
		cm.cancelOnFlood(cancelCall)
		stopAbort := func() bool { return false }
		if ss.m.abortWrite != nil {
			stopAbort = context.AfterFunc(callCtx, func() { ss.m.abortWrite(cm) })
		}
		toolRes, readRes, err = ss.call(callCtx, method, req, st.token)
		stopAbort()
		if notes, shared := cm.serverMessages(); err == nil && !shared {
			st.catchUp(notes)
		}
		ss.calls.end(st)
		cancelCall()
		if err != nil {
			authRefused = authFailure(err, ss.m)
		}
		observed = time.Now()
		sent, acked, sendTime, n, exceeded = cm.state()
		flooded = cm.isFlooded()
		exceeded = exceeded || n > cm.limit
		// A session whose transport failed, or on which a call gave up
		// while its response may still arrive, serves no other call: it
		// drains and closes. The abandoned call's limit keeps bounding the
		// session until then, since its response may still be on the way.
		broken := err != nil && !isServerError(err) && !endedForInput(err)
		if !broken || !sent {
			ss.m.unregister(cm)
		}
		if broken && sent && (ctx.Err() != nil || flooded) {
			// The call was given up: the server hears so
			// (notifications/cancelled) before the session closes.
			e.releaseAfterNotice(cm.cancelled)
		} else {
			e.release(broken)
		}
		if broken && !sent && !flooded && attempt == 1 && ctx.Err() == nil {
			// The session had died (its server exited, say) before the
			// request went out: nothing was sent, so a fresh session may
			// carry it.
			s.log.Info("execute: the session broke before the request was sent; retrying on a new session",
				"connection_id", conn.GetId(), "attempt_id", req.GetAttemptId())
			continue
		}
		if err != nil && flooded && !exceeded {
			// The call was cancelled for the flood; whatever the
			// server did with the request is unknown.
			s.log.Warn("execute: the server's notifications exceeded the call's bound; call cancelled",
				"connection_id", conn.GetId(), "attempt_id", req.GetAttemptId(),
				"max_notifications", maxNotificationsPerCall, "max_notification_bytes", maxNotificationBytesPerCall)
			setStage(resp, sent, acked, sendTime)
			resp.ResponseBytes = n
			return failFact(resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeNotificationLimitExceeded,
				fmt.Sprintf("the server sent more than %d notifications or %d bytes of them during the call; the adapter cancelled it",
					maxNotificationsPerCall, maxNotificationBytesPerCall))
		}
		break
	}
	setStage(resp, sent, acked, sendTime)
	resp.ResponseBytes = n
	if asked, msg := st.inputRequested(); asked && (err == nil || isServerError(err) || endedForInput(err)) {
		// The server answered a call it had asked user input for, which
		// the adapter declined: the answer is not the call's result.
		resp.Stage = adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED
		resp.ObserveTime = timestamppb.New(observed)
		resp = failFact(resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeUserInputRequired, inputRequiredFact())
		resp.Error.UntrustedDetail = msg
		return resp
	}
	if err == nil && exceeded {
		// The response was read whole (a concurrent call's larger limit
		// allowed the message) but is over this call's own limit: refused
		// as if the transport had cut it.
		return failFact(resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeResponseLimitExceeded, limitDetail(limits))
	}
	if err != nil {
		if exceeded {
			return failFact(resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeResponseLimitExceeded, limitDetail(limits))
		}
		if authRefused != nil {
			return authRefused.executeFailure(resp) // refused before the server acted
		}
		return s.callFailed(ctx, resp, err, sent)
	}
	resp.Stage = adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED
	resp.ObserveTime = timestamppb.New(observed)

	var r result
	if toolRes != nil {
		if toolRes.IsError {
			return fail(resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeToolError, toolErrorText(toolRes))
		}
		r, err = fromToolResult(toolRes, limits, schema)
	} else {
		r, err = fromReadResult(readRes, limits)
	}
	if err != nil {
		return contentFailed(resp, err)
	}
	resp.Items, resp.StructuredContent, resp.ResponseDigest, resp.Diagnostics = r.items, r.structured, r.digest, r.diagnostics
	resp.Outcome = adapterv1.Outcome_OUTCOME_OK
	return resp
}

// setStage records how far the call's request got.
func setStage(resp *adapterv1.ExecuteResponse, sent, acked bool, sendTime time.Time) {
	if sent {
		resp.Stage = adapterv1.DeliveryStage_DELIVERY_STAGE_SENT
		resp.SendTime = timestamppb.New(sendTime)
	}
	if acked {
		resp.Stage = adapterv1.DeliveryStage_DELIVERY_STAGE_ACKNOWLEDGED
	}
}

// call sends the call's request on the session: a tools/call or a
// resources/read carrying the attempt id in _meta, and progressToken, so
// the server may report its progress.
func (ss *session) call(ctx context.Context, method string, req *adapterv1.ExecuteRequest, progressToken string) (*mcp.CallToolResult, *mcp.ReadResourceResult, error) {
	meta := mcp.Meta{AttemptMetaKey: req.GetAttemptId(), "progressToken": progressToken}
	telemetry.InjectMeta(ctx, meta) // traceparent for servers behind stdio, which has no headers
	if method == "tools/call" {
		params := &mcp.CallToolParams{Meta: meta, Name: req.GetTarget().GetName()}
		if a := req.GetArguments(); a != nil {
			params.Arguments = a.AsMap()
		} else {
			params.Arguments = map[string]any{}
		}
		res, err := ss.callTool(ctx, params)
		return res, nil, err
	}
	res, err := ss.readResource(ctx, &mcp.ReadResourceParams{Meta: meta, URI: req.GetTarget().GetName()})
	return nil, res, err
}

// contentFailed fails a call whose result was read whole but could not be
// accepted: a broken limit or output schema is an answer that does not
// fit (INVALID_REQUEST); anything else is a result nobody can read, whose
// effect is unknown.
func contentFailed(resp *adapterv1.ExecuteResponse, err error) *adapterv1.ExecuteResponse {
	var ce *contentError
	if errors.As(err, &ce) {
		resp = failFact(resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, ce.code, ce.detail)
		resp.Error.UntrustedDetail = ce.untrusted
		return resp
	}
	return fail(resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeMalformedResult, "")
}

// callFailed maps a failed call onto an outcome by the strongest evidence
// reached: a JSON-RPC error the server sent, or a transport that broke
// before (unavailable) or after (unknown) the request was sent. (A limit
// hit is the caller's to map first: on a shared session only the call's
// own meter says whether the message cut was its response.)
func (s *Server) callFailed(ctx context.Context, resp *adapterv1.ExecuteResponse, err error, sent bool) *adapterv1.ExecuteResponse {
	var werr *jsonrpc.Error
	if errors.As(err, &werr) && !localJSONRPCCodes[werr.Code] {
		resp.Stage = adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED
		resp.ObserveTime = timestamppb.Now()
		outcome := adapterv1.Outcome_OUTCOME_UNKNOWN
		switch werr.Code {
		case jsonrpc.CodeInvalidParams, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidRequest:
			outcome = adapterv1.Outcome_OUTCOME_INVALID_REQUEST
		}
		return fail(resp, outcome, fmt.Sprintf("JSONRPC_%d", werr.Code), truncate(werr.Message, maxDetailBytes))
	}
	s.log.Warn("execute: call failed", "sent", sent, "error", logText(err))
	// A message arrived that is not JSON-RPC, or a response that is not a
	// result of the method's shape: the server answered something, and
	// what it did is unknown.
	var (
		te *json.UnmarshalTypeError
		se *json.SyntaxError
	)
	switch {
	case errors.As(err, &se):
		return fail(resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeMalformedMessage, "")
	case errors.As(err, &te):
		return fail(resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeMalformedResult, "")
	}
	if !sent {
		return fail(resp, adapterv1.Outcome_OUTCOME_UNAVAILABLE, CodeServerUnreachable, "")
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fail(resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeDeadlineExceeded, "")
	case errors.Is(ctx.Err(), context.Canceled):
		return fail(resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeCancelled, "")
	}
	return fail(resp, adapterv1.Outcome_OUTCOME_UNKNOWN, CodeTransportClosed, "")
}

// isServerError reports whether err is a JSON-RPC error the server sent:
// an answer, after which the session is as good as before.
func isServerError(err error) bool {
	var werr *jsonrpc.Error
	return errors.As(err, &werr) && !localJSONRPCCodes[werr.Code]
}

// localJSONRPCCodes are codes the client library itself produces for a
// transport that rejected, or a session that is closing: transport
// evidence, not an answer from the server.
var localJSONRPCCodes = map[int64]bool{-32003: true, -32004: true, -32005: true}

// limitDetail is an adapter-authored fact about the limit, not remote text.
func limitDetail(l *registryv1.Limits) string {
	return fmt.Sprintf("response exceeded max_response_bytes=%d", l.GetMaxResponseBytes())
}

func fail(resp *adapterv1.ExecuteResponse, o adapterv1.Outcome, code, detail string) *adapterv1.ExecuteResponse {
	resp.Outcome = o
	resp.Items, resp.StructuredContent, resp.ResponseDigest = nil, nil, ""
	resp.Error = &adapterv1.ErrorEvidence{SafeCode: code, UntrustedDetail: detail}
	return resp
}

// failFact is fail for a failure the adapter itself detected: the detail
// is the adapter's own account (which limit, which item), not remote text.
func failFact(resp *adapterv1.ExecuteResponse, o adapterv1.Outcome, code, fact string) *adapterv1.ExecuteResponse {
	resp = fail(resp, o, code, "")
	resp.Error.AdapterDetail = fact
	return resp
}

// toolErrorText joins a tool error's text blocks, bounded.
func toolErrorText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			if b.Len() > 0 {
				b.WriteString("\n")
			}
			b.WriteString(t.Text)
			if b.Len() > maxDetailBytes {
				break
			}
		}
	}
	return truncate(b.String(), maxDetailBytes)
}

// logText is an error as logged: its text, which may carry remote text
// (a server's JSON-RPC message, a dependency's detail), truncated to
// maxDetailBytes so a server cannot fill the log.
func logText(err error) string {
	if err == nil {
		return ""
	}
	return truncate(err.Error(), maxDetailBytes)
}

// truncate cuts s to at most n bytes on a rune boundary and drops invalid
// UTF-8.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

func outcomeName(o adapterv1.Outcome) string {
	return strings.ToLower(strings.TrimPrefix(o.String(), "OUTCOME_"))
}
