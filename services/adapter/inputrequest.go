//lint:file-ignore SA1019 sampling and roots are deprecated in 2026-07-28 (SEP-2577), but servers still ask for them: the adapter must recognise such a request to refuse it.

package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A 2026-07-28 server asks for input inside the call's result
// (resultType input_required) and expects the call again with the answers.
// The adapter answers only elicitation, and only with "decline"
// (session.elicit); a request for a model completion (sampling), for the
// client's roots or of any other kind has no honest answer here, so the
// call ends at once as USER_INPUT_REQUIRED instead of sending one. The
// client library's own handling is disabled for this (it would answer a
// roots request with an empty list nobody chose, and report a sampling
// request as an error of the server's).

// maxInputRounds bounds how often one call is sent again after an
// input_required result (a server shedding load asks with no requests).
const maxInputRounds = 3

// errInputUnanswerable ends a call whose server asked for input the
// adapter never gives.
var errInputUnanswerable = errors.New("the server asked for input the adapter does not give (sampling, roots)")

// errInputRoundsExceeded ends a call whose server kept answering
// input_required.
var errInputRoundsExceeded = fmt.Errorf("the server asked for input more than %d times", maxInputRounds)

// endedForInput reports whether err is the adapter ending a call because
// of what its server asked for: the call's outcome is USER_INPUT_REQUIRED,
// not a transport failure.
func endedForInput(err error) bool {
	return errors.Is(err, errInputDeclinedAgain) || errors.Is(err, errInputUnanswerable) || errors.Is(err, errInputRoundsExceeded)
}

// inputRequired is the client's sending middleware that handles
// input_required results of tools/call and resources/read.
func (ss *session) inputRequired(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		for round := 1; ; round++ {
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			asks, state, ok := inputRequestsOf(res)
			if !ok {
				return res, nil
			}
			if round >= maxInputRounds {
				// An answer of the server's own asking, not a transport
				// failure: the call ends as USER_INPUT_REQUIRED.
				asked, _ := json.Marshal(asks)
				ss.recordAsk(ctx, string(asked))
				return nil, errInputRoundsExceeded
			}
			answers, err := ss.answerInput(ctx, asks)
			if err != nil {
				return nil, err
			}
			if req, err = withInputResponses(req, answers, state); err != nil {
				return nil, err
			}
		}
	}
}

// inputRequestsOf returns what an input_required result asks for.
func inputRequestsOf(res mcp.Result) (mcp.InputRequestMap, string, bool) {
	switch r := res.(type) {
	case *mcp.CallToolResult:
		return r.InputRequests, r.RequestState, r.NeedsInput()
	case *mcp.ReadResourceResult:
		return r.InputRequests, r.RequestState, r.NeedsInput()
	}
	return nil, "", false
}

// answerInput answers a round of input requests: elicitation is declined;
// anything else ends the call, before any answer is sent.
func (ss *session) answerInput(ctx context.Context, asks mcp.InputRequestMap) (mcp.InputResponseMap, error) {
	for _, ask := range asks {
		if _, ok := ask.(*mcp.ElicitParams); !ok {
			return nil, ss.unanswerable(ctx, ask)
		}
	}
	answers := make(mcp.InputResponseMap, len(asks))
	for id, ask := range asks {
		res, err := ss.elicit(ctx, &mcp.ElicitRequest{Params: ask.(*mcp.ElicitParams)})
		if err != nil {
			return nil, err
		}
		answers[id] = res
	}
	return answers, nil
}

// unanswerable records, for the call on ctx, a server's request the
// adapter does not answer, with the request (remote text, scrubbed and
// truncated) as its detail.
func (ss *session) unanswerable(ctx context.Context, ask mcp.InputRequest) error {
	method := "input"
	switch ask.(type) {
	case *mcp.CreateMessageParams, *mcp.CreateMessageWithToolsParams:
		method = "sampling/createMessage"
	case *mcp.ListRootsParams:
		method = "roots/list"
	}
	params, _ := json.Marshal(ask)
	ss.srv.log.Info("a server asked for input the adapter does not give; the call ends",
		"connection_id", ss.connectionID, "method", method)
	ss.recordAsk(ctx, method+" "+string(params))
	return errInputUnanswerable
}

// recordAsk records, for the call on ctx, that its server asked for input
// the adapter did not give, detail being the request (remote text; it is
// scrubbed here and truncated when kept).
func (ss *session) recordAsk(ctx context.Context, detail string) {
	if st, _ := ctx.Value(callStateKey{}).(*callState); st != nil {
		st.askedFor(ss.creds.text(detail))
	}
}

// withInputResponses is req sent again with the answers and the server's
// state; the caller's params are not changed.
func withInputResponses(req mcp.Request, answers mcp.InputResponseMap, state string) (mcp.Request, error) {
	r, ok := req.(*mcp.ClientRequest[mcp.Params])
	if !ok {
		return nil, fmt.Errorf("input_required for a %T", req)
	}
	var params mcp.Params
	switch p := r.Params.(type) {
	case *mcp.CallToolParams:
		cp := *p
		cp.InputResponses, cp.RequestState = answers, state
		params = &cp
	case *mcp.ReadResourceParams:
		cp := *p
		cp.InputResponses, cp.RequestState = answers, state
		params = &cp
	default:
		return nil, fmt.Errorf("input_required for %T", r.Params)
	}
	return &mcp.ClientRequest[mcp.Params]{Session: r.Session, Params: params}, nil
}
