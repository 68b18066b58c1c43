package adapter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// What a server says to the client during a call, outside the call's
// response: progress notifications, kept (bounded) as protocol evidence,
// and requests for user input (elicitation, in a server request or in a
// 2026-07-28 input_required result), which the adapter declines: no
// person answers through the adapter, so no answer could be theirs (a
// reviewed mapping may let it accept a form's own defaults:
// elicitdefaults.go).
// Requests for a model completion or the client's roots inside an
// input_required result end the call (inputrequest.go).

// Bounds of the progress a call keeps as evidence.
const (
	// maxProgressNotes is how many progress notifications of one call are
	// kept; later ones are only counted.
	maxProgressNotes = 16
	// maxProgressMessageBytes bounds a progress message, remote text.
	maxProgressMessageBytes = 256
	// maxElicitMessageBytes bounds the server's elicitation message
	// returned as untrusted detail.
	maxElicitMessageBytes = 256
)

// CodeUserInputRequired: the server asked for user input during the call
// (elicitation). The adapter declined it, as no person answers through
// the adapter, and does not use the server's answer: the call needs a
// person or a mapping that does not ask for one.
const CodeUserInputRequired = "USER_INPUT_REQUIRED"

// errInputDeclinedAgain ends a call whose server asked for user input
// again after the adapter had declined: the call ends at once instead of
// going round until its deadline.
var errInputDeclinedAgain = errors.New("the server asked for user input again after the adapter declined it")

// progressNote is one progress notification as evidence.
type progressNote struct {
	at              time.Time
	progress, total float64
	message         string // remote text, truncated
}

// callState is one call's share of what its server said besides the
// response.
type callState struct {
	token string // the progress token the call's request carries

	mu            sync.Mutex
	progress      []progressNote
	progressCount int64
	elicited      int
	elicitMessage string // the first elicitation's message, remote text, truncated

	// elicitation is the mapping's policy for elicitation; answers are
	// the form elicitations it let the adapter accept with defaults.
	elicitation registryv1.ElicitationPolicy
	answers     []elicitAnswer
}

// elicitAnswers returns the form elicitations accepted with defaults.
func (st *callState) elicitAnswers() []elicitAnswer {
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Clone(st.answers)
}

// notes returns the progress kept and how many notifications came.
func (st *callState) notes() ([]progressNote, int64) {
	if st == nil {
		return nil, 0
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]progressNote(nil), st.progress...), st.progressCount
}

// inputRequested reports whether the server asked for user input during
// the call, and its first message.
func (st *callState) inputRequested() (bool, string) {
	if st == nil {
		return false, ""
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.elicited > 0, st.elicitMessage
}

// heard counts the server's messages the call's handlers have seen.
func (st *callState) heard() int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.progressCount + int64(st.elicited)
}

// catchUpWait bounds how long a call that returned waits for the
// handlers of messages the server sent before its response: the client
// library hands the response to the call and those messages to their
// handlers on different goroutines.
const catchUpWait = 500 * time.Millisecond

// catchUp waits, at most catchUpWait, until st's handlers have seen the n
// server messages that arrived while the call was in flight.
func (st *callState) catchUp(n int64) {
	if st.heard() >= n {
		return
	}
	deadline := time.Now().Add(catchUpWait)
	for st.heard() < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// callStates are the calls in flight on one session, by progress token.
type callStates struct {
	mu      sync.Mutex
	next    int64
	byToken map[string]*callState
}

// begin registers a call about to be sent, under its mapping's
// elicitation policy.
func (c *callStates) begin(elicitation registryv1.ElicitationPolicy) *callState {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	st := &callState{token: "v0m3-" + strconv.FormatInt(c.next, 10), elicitation: elicitation}
	if c.byToken == nil {
		c.byToken = map[string]*callState{}
	}
	c.byToken[st.token] = st
	return st
}

// end removes a call that returned.
func (c *callStates) end(st *callState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byToken, st.token)
}

// byProgressToken is the call a progress notification names, or nil.
func (c *callStates) byProgressToken(tok any) *callState {
	s, ok := tok.(string)
	if !ok {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byToken[s]
}

// only is the one call in flight, or nil when there are none or several:
// a server request that names no call is attributed only when that is
// certain.
func (c *callStates) only() *callState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byToken) != 1 {
		return nil
	}
	for _, st := range c.byToken {
		return st
	}
	return nil
}

// callStateKey carries a call's state in its context, where the client
// library's handling of an input_required result (which runs on the
// call's context) finds it.
type callStateKey struct{}

// withCallState returns ctx carrying st.
func withCallState(ctx context.Context, st *callState) context.Context {
	return context.WithValue(ctx, callStateKey{}, st)
}

// progressed records a progress notification for the call it names.
// Unknown tokens are ignored: the notification was already counted
// against the session's notification bounds.
func (ss *session) progressed(p *mcp.ProgressNotificationParams) {
	if p == nil {
		return
	}
	st := ss.calls.byProgressToken(p.ProgressToken)
	if st == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.progressCount++
	if len(st.progress) < maxProgressNotes {
		st.progress = append(st.progress, progressNote{at: time.Now(), progress: p.Progress, total: p.Total,
			message: truncate(ss.creds.text(p.Message), maxProgressMessageBytes)})
	}
}

// elicit answers a server's request for user input: declined, always. A
// request that arrives on a call's context (a 2026-07-28 input_required
// result) belongs to that call; a server request (earlier versions)
// names no call and is attributed to the session's only call in flight,
// if there is exactly one. A second request during the same call ends it.
func (ss *session) elicit(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	st, _ := ctx.Value(callStateKey{}).(*callState)
	if st == nil {
		st = ss.calls.only()
	}
	msg := ""
	if req != nil && req.Params != nil {
		msg = req.Params.Message
	}
	if res := ss.acceptDefaults(st, req, msg); res != nil {
		return res, nil
	}
	ss.srv.log.Info("declined a server's request for user input: no person answers through the adapter",
		"connection_id", ss.connectionID, "attributed_to_call", st != nil)
	if st == nil {
		return &mcp.ElicitResult{Action: "decline"}, nil
	}
	if st.askedFor(ss.creds.text(msg)) > 1 {
		return nil, errInputDeclinedAgain
	}
	return &mcp.ElicitResult{Action: "decline"}, nil
}

// acceptDefaults answers a form elicitation with its schema's defaults
// when the call's mapping allows it (and records the answer as evidence);
// nil when it does not, or the request has no such answer.
func (ss *session) acceptDefaults(st *callState, req *mcp.ElicitRequest, msg string) *mcp.ElicitResult {
	if st == nil || !acceptsDefaults(st.elicitation) || req == nil {
		return nil
	}
	content, fields, ok := defaultsAnswer(req.Params, ss.creds.text)
	if !ok {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.answers) >= maxElicitAnswers {
		return nil
	}
	st.answers = append(st.answers, elicitAnswer{at: time.Now(), message: truncate(ss.creds.text(msg), maxElicitMessageBytes), fields: fields})
	ss.srv.log.Info("accepted a server's form with its defaults, as the call's mapping allows",
		"connection_id", ss.connectionID, "fields", len(fields))
	return &mcp.ElicitResult{Action: "accept", Content: content}
}

// askedFor records that the server asked the call for input, detail
// being the request (remote text, scrubbed), kept truncated if it is the
// first; it returns how many times the call was asked.
func (st *callState) askedFor(detail string) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.elicited++
	if st.elicited == 1 {
		st.elicitMessage = truncate(detail, maxElicitMessageBytes)
	}
	return st.elicited
}

// inputRequiredFact is the adapter's account of a call whose server asked
// for user input.
func inputRequiredFact() string {
	return fmt.Sprintf("the server asked for user input (or a model completion, or the client's roots) during the call; the adapter gave none (no person answers through the adapter) and does not use what the server answered after that. Map a tool that needs no user input, or have a person use the server directly; the server's request is the untrusted detail (at most %d bytes)", maxElicitMessageBytes)
}
