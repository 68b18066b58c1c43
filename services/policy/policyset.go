package policy

import (
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	cedar "github.com/cedar-policy/cedar-go"

	"github.com/v0m3/v0m3/internal/digest"
)

// defaultPolicy is the built-in policy used when no policy file is
// configured: retrieval for reviewing and rewriting, previews for authors
// and delivery for publishers (both after approval), nothing else.
//
//go:embed default.cedar
var defaultPolicy []byte

// defaultPolicyName names the built-in policy in logs and errors.
const defaultPolicyName = "default.cedar"

// Annotation keys the policy service reads.
const (
	annotationID       = "id"
	annotationApproval = "approval"
	// annotationRefusal on a forbid policy names the ErrorInfo reason a
	// refusal it decides carries, e.g. @refusal("SELF_APPROVAL").
	annotationRefusal = "refusal"
)

// ParseError is a policy text that was refused. Line and Column point at
// the offending token (1-based) when the parser reported a position.
type ParseError struct {
	// File is the policy file name.
	File string
	// Line is the 1-based line, 0 when unknown.
	Line int
	// Column is the 1-based column, 0 when unknown.
	Column int
	// Msg says what is wrong.
	Msg string
}

// Error implements error.
func (e *ParseError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("policy %s: line %d, column %d: %s", e.File, e.Line, e.Column, e.Msg)
	}
	return fmt.Sprintf("policy %s: %s", e.File, e.Msg)
}

// cedarPos matches the position cedar-go puts in its parse and scan errors;
// cedarNoise matches the parts of those messages that repeat the position.
var (
	cedarPos   = regexp.MustCompile(`<input>:(\d+):(\d+)`)
	cedarNoise = regexp.MustCompile(`^(parser error: )?(parse error at )?<input>:\d+:\d+:? ?`)
)

// compiled is one immutable, parsed policy revision. The server swaps whole
// revisions atomically, so a decision never sees half of a reload.
type compiled struct {
	set      *cedar.PolicySet
	revision string
	loadTime time.Time
	source   string
	ids      []string
	// approval holds the ids of permit policies annotated
	// @approval("required").
	approval map[cedar.PolicyID]bool
	// refusal maps forbid policies to their @refusal reason.
	refusal map[cedar.PolicyID]string
}

// compile parses policy text. Every policy must carry a unique @id
// annotation: the ids are what decisions cite as reasons, so an anonymous
// policy would make a decision unexplainable.
func compile(name string, text []byte, now time.Time) (*compiled, error) {
	list, err := cedar.NewPolicyListFromBytes(name, text)
	if err != nil {
		return nil, parseError(name, err)
	}
	c := &compiled{
		set:      cedar.NewPolicySet(),
		revision: digest.Bytes(text),
		loadTime: now,
		source:   name,
		approval: map[cedar.PolicyID]bool{},
		refusal:  map[cedar.PolicyID]string{},
	}
	for i, p := range list {
		pos := p.Position()
		ann := p.Annotations()
		id, ok := ann[annotationID]
		if !ok || strings.TrimSpace(string(id)) == "" {
			return nil, &ParseError{File: name, Line: pos.Line, Column: pos.Column,
				Msg: fmt.Sprintf("policy #%d has no @id annotation; every policy needs a unique @id(\"...\")", i+1)}
		}
		pid := cedar.PolicyID(id)
		if !c.set.Add(pid, p) {
			return nil, &ParseError{File: name, Line: pos.Line, Column: pos.Column,
				Msg: fmt.Sprintf("duplicate policy id %q", string(id))}
		}
		c.ids = append(c.ids, string(id))
		if p.Effect() == cedar.Permit && ann[annotationApproval] == "required" {
			c.approval[pid] = true
		}
		if r := strings.TrimSpace(string(ann[annotationRefusal])); p.Effect() == cedar.Forbid && r != "" {
			c.refusal[pid] = r
		}
	}
	slices.Sort(c.ids)
	return c, nil
}

// parseError turns a cedar-go error into a ParseError with the line and
// column cedar-go embedded in its message.
func parseError(name string, err error) *ParseError {
	msg := err.Error()
	pe := &ParseError{File: name, Msg: strings.ReplaceAll(msg, "<input>", name)}
	if m := cedarPos.FindStringSubmatch(msg); m != nil {
		pe.Line, _ = strconv.Atoi(m[1])
		pe.Column, _ = strconv.Atoi(m[2])
		// "parse error at <input>:3:28 \";\": invalid primary" becomes
		// "at \";\": invalid primary"; a scanner error keeps its text.
		if n := cedarNoise.FindStringSubmatchIndex(msg); n != nil && n[1] < len(msg) {
			pe.Msg = msg[n[1]:]
			if n[4] >= 0 {
				pe.Msg = "at " + pe.Msg
			}
		}
	}
	return pe
}

// asParseError returns err's ParseError, if any.
func asParseError(err error) (*ParseError, bool) {
	var pe *ParseError
	ok := errors.As(err, &pe)
	return pe, ok
}
