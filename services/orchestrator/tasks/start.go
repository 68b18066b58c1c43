package tasks

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/store"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	policyv1 "github.com/v0m3/v0m3/proto/v0m3/policy/v1"
)

// StartTask is idempotent through its request_id (AIP-155). The key is
// scoped to the requester and the caller that acts for it: the task id is
// derived from (requester, actor, request id), so the store's
// create-if-absent on the task is the one atomic step that decides which
// call starts the task, on any replica. A retry compares its payload with
// the task recorded and, when it is the same, returns that task and its
// catalogue: the same handles.

// maxRequestIDLen bounds a request_id.
const maxRequestIDLen = 128

// ReasonKeyReused refuses a request_id reused with another payload.
const ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"

// StartRetryWait bounds how long a retry waits for the first call to
// finish compiling the catalogue; the first call stores its catalogue
// within it or not at all.
const StartRetryWait = 30 * time.Second

// StartAbandoned is how long after its creation a task may still be
// waiting for its catalogue: the first call's own work is bounded by
// StartRetryWait and its internal calls' deadlines, so a task with no
// catalogue twice that long after it was recorded belongs to a start that
// was interrupted (its replica killed, its store full) and a retry ends
// it.
const StartAbandoned = 2 * StartRetryWait

var taskIDEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// IdempotentID is the task id for a request id: a digest, so it tells
// nothing about the requester or key, and collides only when they match.
func IdempotentID(requester, actor, requestID string) string {
	h := sha256.New()
	for _, p := range []string{"v0m3 StartTask", requester, actor, requestID} {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return "task_" + strings.ToLower(taskIDEncoding.EncodeToString(h.Sum(nil)[:16]))
}

// CheckRequestID refuses a request_id too long or with spaces or control
// characters (FIELD_INVALID).
func CheckRequestID(id string) error {
	if len(id) > maxRequestIDLen || strings.ContainsFunc(id, func(r rune) bool { return r < 0x21 || r == 0x7f }) {
		return apierror.InvalidArgument(apierror.ReasonFieldInvalid,
			fmt.Sprintf("request_id must be at most %d printable characters without spaces, e.g. a UUID", maxRequestIDLen),
			apierror.FieldViolation{Field: "request_id", Description: "at most 128 printable characters without spaces"})
	}
	return nil
}

// KindProfile is the profile a deprecated task kind names: the kind's
// name in lower snake case, e.g. "source_review" for
// TASK_KIND_SOURCE_REVIEW.
func KindProfile(kind orchestratorv1.TaskKind) string {
	return strings.ToLower(strings.TrimPrefix(kind.String(), "TASK_KIND_"))
}

// samePayload reports whether req asks for what task records: the
// requester, actor, purpose, scopes (sources, artifacts, destinations),
// evidence flag and profile. The
// requester's groups are not payload: they come from the token, which a
// retry may renew.
func samePayload(req *orchestratorv1.StartTaskRequest, task *orchestratorv1.Task, requester *policyv1.Principal, actor string) bool {
	profile := req.GetProfile()
	if profile == "" {
		profile = KindProfile(req.GetKind())
	}
	sameRefs := func(a, b []*orchestratorv1.SourceRef) bool {
		return slices.EqualFunc(a, b, func(x, y *orchestratorv1.SourceRef) bool { return proto.Equal(x, y) })
	}
	return requester.GetId() == task.GetRequester().GetId() && actor == task.GetActor() &&
		req.GetPurpose() == task.GetPurpose() && req.GetEvidencePresent() == task.GetEvidencePresent() &&
		profile == task.GetProfile() && req.GetKind() == task.GetKind() &&
		sameRefs(req.GetSourceScope(), task.GetSourceScope()) &&
		sameRefs(req.GetArtifactScope(), task.GetArtifactScope()) &&
		sameRefs(req.GetDestinationScope(), task.GetDestinationScope())
}

// Create records task, new, as started (active). A task with its id
// fails with store.ErrExists: another call with the same request id
// created it first.
func (s *Service) Create(ctx context.Context, task *orchestratorv1.Task) error {
	if err := Move(task, Start); err != nil {
		return err
	}
	return s.st.CreateTask(ctx, task)
}

// Exists reports whether task id is recorded.
func (s *Service) Exists(ctx context.Context, id string) (bool, error) {
	_, err := s.st.GetTask(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Replay answers a StartTask whose task already exists under its request
// id: the same task and catalogue when the payload is the same. It waits
// up to StartRetryWait for a catalogue still being compiled, and ends a
// start abandoned without one (TASK_START_FAILED).
func (s *Service) Replay(ctx context.Context, req *orchestratorv1.StartTaskRequest, id string, requester *policyv1.Principal, actor string) (*orchestratorv1.Task, *orchestratorv1.OfferedCatalogue, error) {
	task, err := s.Load(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if !samePayload(req, task, requester, actor) {
		return nil, nil, apierror.New(codes.AlreadyExists, ReasonKeyReused,
			fmt.Sprintf("request_id %q already started a task with another payload; use a new request_id for a new task", req.GetRequestId()),
			map[string]string{"request_id": req.GetRequestId()})
	}
	deadline := time.Now().Add(StartRetryWait)
	for {
		cat, err := s.st.GetCatalogue(ctx, id)
		if err == nil {
			s.log.DebugContext(ctx, "task start replayed", "task", id)
			return task, cat, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return nil, nil, s.internal(ctx, "get catalogue", err)
		}
		if task.GetState() == Active && s.now().Sub(task.GetCreateTime().AsTime()) >= StartAbandoned {
			if task, err = s.endAbandonedStart(ctx, id); err != nil {
				return nil, nil, err
			}
			if task.GetState() == Active {
				continue // its catalogue arrived meanwhile
			}
		}
		if task.GetState() != Active {
			return nil, nil, apierror.New(codes.FailedPrecondition, "TASK_START_FAILED",
				fmt.Sprintf("the task request_id %q started could not be given a catalogue and is %s (%s); use a new request_id to try again",
					req.GetRequestId(), Name(task.GetState()), task.GetCheckpoint()),
				map[string]string{"request_id": req.GetRequestId(), "task_id": id})
		}
		if time.Now().After(deadline) {
			return nil, nil, apierror.New(codes.Unavailable, "TASK_STARTING",
				fmt.Sprintf("the task request_id %q started is still compiling its catalogue; retry", req.GetRequestId()),
				map[string]string{"request_id": req.GetRequestId(), "task_id": id})
		}
		select {
		case <-ctx.Done():
			return nil, nil, status.FromContextError(ctx.Err()).Err()
		case <-time.After(50 * time.Millisecond):
		}
		if task, err = s.Load(ctx, id); err != nil {
			return nil, nil, err
		}
	}
}

// endAbandonedStart cancels task id, still active without a catalogue
// StartAbandoned after it was recorded, and returns it as it then is. The
// first call gave up storing the catalogue at StartRetryWait (StartTask
// bounds its work so), so the margin of StartAbandoned covers a write in
// flight when it gave up.
func (s *Service) endAbandonedStart(ctx context.Context, id string) (*orchestratorv1.Task, error) {
	const detail = "start interrupted before its catalogue was stored"
	if _, err := s.st.GetCatalogue(ctx, id); err == nil {
		return s.Load(ctx, id)
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, s.internal(ctx, "get catalogue", err)
	}
	ended := false
	task, err := s.st.UpdateTask(ctx, id, func(t *orchestratorv1.Task) error {
		ended = Move(t, Cancel) == nil
		if ended {
			t.Checkpoint, t.UpdateTime = detail, s.timestamp()
		}
		return nil
	})
	if err != nil {
		return nil, s.Err(ctx, id, err)
	}
	if ended {
		s.log.InfoContext(ctx, "abandoned task start ended", "task", id)
		s.TellStartStopped(ctx, id, detail)
	}
	return task, nil
}
