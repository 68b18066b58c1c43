package orchestrator

import (
	"fmt"
	"strings"

	"github.com/v0m3/v0m3/internal/apierror"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
)

// splitPassages splits source text into passages at blank lines (lines
// holding only whitespace). Passage ids are "p1".."pN" in order, so the same
// content always yields the same passage identities.
func splitPassages(text string) []*evidencev1.Passage {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	var (
		out     []*evidencev1.Passage
		current []string
	)
	flush := func() {
		if len(current) == 0 {
			return
		}
		out = append(out, &evidencev1.Passage{
			PassageId: fmt.Sprintf("p%d", len(out)+1),
			Text:      strings.TrimSpace(strings.Join(current, "\n")),
			Index:     int32(len(out)),
		})
		current = nil
	}
	for line := range strings.SplitSeq(text, "\n") {
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		current = append(current, line)
	}
	flush()
	return out
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string { return apierror.Truncate(s, n) }

func outcomeName(o adapterv1.Outcome) string {
	return strings.ToLower(strings.TrimPrefix(o.String(), "OUTCOME_"))
}

func stageName(st adapterv1.DeliveryStage) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "DELIVERY_STAGE_"))
}

func requestStateName(st orchestratorv1.RequestState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "REQUEST_STATE_"))
}
