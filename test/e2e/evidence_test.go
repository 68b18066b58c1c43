package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/demo/fixture/fixturedirect"
	"github.com/v0m3/v0m3/demo/scenario"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	evidencev1 "github.com/v0m3/v0m3/proto/v0m3/evidence/v1"
	orchestratorv1 "github.com/v0m3/v0m3/proto/v0m3/orchestrator/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
	"github.com/v0m3/v0m3/services/adapter"
	"github.com/v0m3/v0m3/suite"
)

const rateLimitsURI = fixture.URIPrefix + "rate-limits"

// evidenceWorld is a suite with its own configuration plus one HTTP
// fixture connection at a fixed address, mapped with the given limits.
func evidenceWorld(t *testing.T, cfg suite.Config, limits *registryv1.Limits, fixtureArgs ...string) *world {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	s, err := suite.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start suite: %v", err)
	}
	t.Cleanup(s.Close)
	w := &world{t: t, s: s, callLog: filepath.Join(testkit.WritableDir(t), "calls.jsonl"), addr: testkit.FreeLoopbackAddr(t)}
	w.restartFixture(fixtureArgs...)
	ctx := testkit.As(w.s, scenario.Integrator)
	w.conn, err = s.Connect(ctx, &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: scenario.HTTPFixture("http://" + w.addr + "/mcp"),
	})
	if err != nil {
		t.Fatal(err)
	}
	w.snap = w.discover()
	m, err := s.Registry.ProposeMapping(ctx, &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: w.conn.GetId(), SnapshotId: w.snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: limits,
	})
	if err != nil {
		t.Fatalf("propose mapping: %v", err)
	}
	w.mapping = w.review(m)
	return w
}

var markdownLimits = &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown"}}

// taskWith starts a source-review task over scope as alice.
func (w *world) taskWith(scope ...*orchestratorv1.SourceRef) *orchestratorv1.StartTaskResponse {
	w.t.Helper()
	resp, err := w.s.Orchestrator.StartTask(testkit.As(w.s, scenario.Alice), &orchestratorv1.StartTaskRequest{
		Profile: "source_review", Purpose: "review", SourceScope: scope,
	})
	if err != nil {
		w.t.Fatalf("start task: %v", err)
	}
	return resp
}

// retrieveLabel asks, as alice, for the source with label in task, with
// query.
func (w *world) retrieveLabel(task *orchestratorv1.StartTaskResponse, call, label, query string) (*orchestratorv1.ToolRequest, error) {
	w.t.Helper()
	handle := scenario.FindHandle(scenario.FindOffered(task.GetCatalogue(), scenario.Retrieve), label)
	if handle == "" {
		w.t.Fatalf("no handle for %q", label)
	}
	return w.s.Orchestrator.SubmitToolRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: task.GetTask().GetId(), ProviderCallId: call, Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": handle, "query": query}),
	})
}

// observationOf returns, as read by an auditor, task's observation of uri.
func observationOf(t *testing.T, s *suite.Suite, taskID, uri string) *evidencev1.SourceObservation {
	t.Helper()
	obs, err := s.Evidence.ListObservations(testkit.As(s, scenario.Auditor), &evidencev1.ListObservationsRequest{TaskId: taskID})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range obs.GetObservations() {
		if o.GetResourceUri() == uri {
			return o
		}
	}
	t.Fatalf("task %s has no observation of %s", taskID, uri)
	return nil
}

func passageText(o *evidencev1.SourceObservation, id string) string {
	for _, p := range o.GetPassages() {
		if p.GetPassageId() == id {
			return p.GetText()
		}
	}
	return ""
}

// TestSourceRevisionOnContentChange: the fixture's rate-limits note changes
// its qualification while its URI stays. The read after the change is a
// new revision of the same source; a claim linked to revision 1 stays on
// revision 1; the live read and the cited one compare as different, with
// the changed passage named.
func TestSourceRevisionOnContentChange(t *testing.T) {
	t.Parallel()
	w := evidenceWorld(t, suite.Config{}, markdownLimits)
	ctx := testkit.As(w.s, scenario.Auditor)
	scope := &orchestratorv1.SourceRef{Uri: rateLimitsURI, Title: "Rate limits"}

	first := w.taskWith(scope)
	if r, err := w.retrieveLabel(first, "call-1", "Rate limits", "limit"); err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("first retrieval: %v %v", r, err)
	}
	cited := observationOf(t, w.s, first.GetTask().GetId(), rateLimitsURI)
	if cited.GetRevisionNumber() != 1 || !strings.Contains(passageText(cited, "p2"), fixture.RateLimitQualification(1)) {
		t.Fatalf("first observation revision %d, p2 %q", cited.GetRevisionNumber(), passageText(cited, "p2"))
	}
	link, err := w.s.Evidence.LinkClaim(testkit.As(w.s, scenario.Alice), &evidencev1.LinkClaimRequest{ClaimId: "claim-rate-per-key", ObservationId: cited.GetId(), PassageId: "p2"})
	if err != nil {
		t.Fatalf("link claim: %v", err)
	}

	// The same server, the same endpoint, the same URI: new content.
	w.restartFixture("--notes-revision", "2")
	second := w.taskWith(scope)
	if r, err := w.retrieveLabel(second, "call-1", "Rate limits", "limit"); err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("second retrieval: %v %v", r, err)
	}
	live := observationOf(t, w.s, second.GetTask().GetId(), rateLimitsURI)
	if live.GetRevisionNumber() != 2 || live.GetRevisionId() == cited.GetRevisionId() || live.GetContentDigest() == cited.GetContentDigest() {
		t.Errorf("live observation revision %d (%s), digest %s; want revision 2 with a new digest", live.GetRevisionNumber(), live.GetRevisionId(), live.GetContentDigest())
	}
	revs, err := w.s.Evidence.ListRevisions(ctx, &evidencev1.ListRevisionsRequest{ConnectionId: w.conn.GetId(), ResourceUri: rateLimitsURI})
	if err != nil || len(revs.GetRevisions()) != 2 || revs.GetRevisions()[0].GetId() != link.GetRevisionId() || revs.GetRevisions()[1].GetId() != live.GetRevisionId() {
		t.Fatalf("revisions = %v, %v", revs, err)
	}

	// The claim stays on the revision it cites.
	again, err := w.s.Evidence.GetObservation(ctx, &evidencev1.GetObservationRequest{Id: link.GetObservationId()})
	if err != nil || again.GetRevisionId() != link.GetRevisionId() || again.GetRevisionNumber() != 1 || !strings.Contains(passageText(again, "p2"), fixture.RateLimitQualification(1)) {
		t.Errorf("cited observation after the change = %v, %v", again, err)
	}
	cmp, err := w.s.Evidence.CompareRevisions(ctx, &evidencev1.CompareRevisionsRequest{BaseObservationId: link.GetObservationId(), OtherObservationId: live.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if !cmp.GetDiffers() || cmp.GetBaseRevisionId() != link.GetRevisionId() || cmp.GetOtherRevisionId() != live.GetRevisionId() ||
		cmp.GetBaseContentDigest() != cited.GetContentDigest() || cmp.GetOtherContentDigest() != live.GetContentDigest() ||
		!slices.Equal(cmp.GetChangedPassageIds(), []string{"p2"}) {
		t.Errorf("comparison = %v", cmp)
	}
	if !strings.Contains(passageText(live, "p2"), fixture.RateLimitQualification(2)) {
		t.Errorf("live p2 = %q", passageText(live, "p2"))
	}
}

// TestDualTraceDistinctions: in one task, four requests end four ways, and
// the trace tells them apart: the product forbade one (no protocol event),
// the server rejected one policy allowed (TOOL_ERROR for a note it does
// not have), one completed remotely but was not recorded (the note is
// larger than evidence keeps inline and the mapping allows no asset), and
// one completed.
func TestDualTraceDistinctions(t *testing.T) {
	t.Parallel()
	lib := fixture.NewLibrary(1)
	inline := map[string]int{}
	for _, n := range lib.Notes() {
		inline[n.URI] = len(strings.Join(strings.Fields(n.Text), " "))
	}
	small, big := inline[rateLimitsURI], inline[scenario.MigrationFAQURI]
	if small >= big {
		t.Fatalf("fixture sizes changed: rate-limits %d, FAQ %d", small, big)
	}
	w := evidenceWorld(t, suite.Config{EvidenceMaxInlineBytes: int64(small+big) / 2}, markdownLimits)
	missingURI := fixture.URIPrefix + "does-not-exist"
	task := w.taskWith(
		&orchestratorv1.SourceRef{Uri: rateLimitsURI, Title: "Rate limits"},
		&orchestratorv1.SourceRef{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"},
		&orchestratorv1.SourceRef{Uri: missingURI, Title: "Missing note"},
	)
	taskID := task.GetTask().GetId()

	ok, err := w.retrieveLabel(task, "call-ok", "Rate limits", "limit")
	if err != nil || ok.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("small note: %v %v", ok, err)
	}
	lost, err := w.retrieveLabel(task, "call-big", "Migration FAQ", "migration")
	if err != nil || lost.GetState() != orchestratorv1.RequestState_REQUEST_STATE_FAILED || lost.GetAttempts()[len(lost.GetAttempts())-1].GetError().GetSafeCode() != "OBSERVATION_NOT_RECORDED" {
		t.Fatalf("large note: %v %v", lost, err)
	}
	rejected, err := w.retrieveLabel(task, "call-missing", "Missing note", "anything")
	if err != nil || rejected.GetState() != orchestratorv1.RequestState_REQUEST_STATE_FAILED {
		t.Fatalf("missing note: %v %v", rejected, err)
	}
	_, err = w.s.Orchestrator.SubmitToolRequest(testkit.As(w.s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: taskID, ProviderCallId: "call-export", Capability: scenario.Deliver,
		Arguments: scenario.MustStruct(map[string]any{"artifact": "workspace", "destination": "anywhere"}),
	})
	if !apierror.Is(err, codes.PermissionDenied, "CAPABILITY_NOT_OFFERED") {
		t.Fatalf("export: %v", err)
	}
	reqs, err := w.s.Orchestrator.ListRequests(testkit.As(w.s, scenario.Alice), &orchestratorv1.ListRequestsRequest{TaskId: taskID})
	if err != nil {
		t.Fatal(err)
	}
	var forbidden string
	for _, r := range reqs.GetRequests() {
		if r.GetProviderCallId() == "call-export" {
			forbidden = r.GetId()
		}
	}

	ctx := testkit.As(w.s, scenario.Auditor)
	cls, err := w.s.Evidence.ClassifyTrace(ctx, &evidencev1.ClassifyTraceRequest{TaskId: taskID})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := w.s.Evidence.GetTrace(ctx, &evidencev1.GetTraceRequest{TaskId: taskID})
	if err != nil {
		t.Fatal(err)
	}
	bySeq := map[int64]*evidencev1.TraceEvent{}
	for _, e := range tr.GetEvents() {
		bySeq[e.GetSequence()] = e
	}
	got := map[string]*evidencev1.RequestClassification{}
	for _, c := range cls.GetRequests() {
		got[c.GetRequestId()] = c
	}
	for _, tc := range []struct {
		name, id string
		class    evidencev1.RequestClass
	}{
		{"completed", ok.GetId(), evidencev1.RequestClass_REQUEST_CLASS_COMPLETED},
		{"completed remotely, not recorded", lost.GetId(), evidencev1.RequestClass_REQUEST_CLASS_NOT_RECORDED},
		{"authorized, server rejected", rejected.GetId(), evidencev1.RequestClass_REQUEST_CLASS_SERVER_REJECTED},
		{"protocol-valid, product forbidden", forbidden, evidencev1.RequestClass_REQUEST_CLASS_PRODUCT_FORBIDDEN},
	} {
		c := got[tc.id]
		if c.GetClass() != tc.class {
			t.Errorf("%s: request %s classified %v, want %v (%v)", tc.name, tc.id, c.GetClass(), tc.class, c)
			continue
		}
		protocolEvents := 0
		for _, seq := range c.GetSequences() {
			if pe := bySeq[seq].GetProtocol(); pe != nil {
				protocolEvents++
			}
		}
		switch tc.class {
		case evidencev1.RequestClass_REQUEST_CLASS_PRODUCT_FORBIDDEN:
			if protocolEvents != 0 || c.GetProductReason() != "CAPABILITY_NOT_OFFERED" {
				t.Errorf("forbidden request has %d protocol events, reason %q", protocolEvents, c.GetProductReason())
			}
		case evidencev1.RequestClass_REQUEST_CLASS_SERVER_REJECTED:
			if protocolEvents == 0 || !strings.HasPrefix(c.GetPolicyDecision(), "allow") || c.GetProtocolSafeCode() != adapter.CodeToolError {
				t.Errorf("server-rejected request: %d protocol events, decision %q, code %q", protocolEvents, c.GetPolicyDecision(), c.GetProtocolSafeCode())
			}
		case evidencev1.RequestClass_REQUEST_CLASS_NOT_RECORDED:
			if protocolEvents == 0 || c.GetProtocolOutcome() != "ok" || c.GetProductReason() != "OBSERVATION_NOT_RECORDED" {
				t.Errorf("not-recorded request: %d protocol events, outcome %q, reason %q", protocolEvents, c.GetProtocolOutcome(), c.GetProductReason())
			}
		}
	}
	// Only the completed request left an observation.
	obs, _ := w.s.Evidence.ListObservations(ctx, &evidencev1.ListObservationsRequest{TaskId: taskID})
	if len(obs.GetObservations()) != 1 || obs.GetObservations()[0].GetResourceUri() != rateLimitsURI {
		t.Errorf("observations = %v", obs.GetObservations())
	}
	// The export never reached the server; the three retrievals did.
	if n := toolCalls(callLog(t, w.callLog)); n != 3 {
		t.Errorf("fixture received %d tools/call, want 3", n)
	}
}

// TestLargeSourceStoredAsAsset: when the mapping allows asset references,
// content over the threshold is stored as an evidence asset by digest; the
// observation keeps passage identities and positions, the excerpts are
// still passed onward as quoted evidence with their passage ids, and a
// claim can cite a passage.
func TestLargeSourceStoredAsAsset(t *testing.T) {
	t.Parallel()
	limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown"}, AssetReferenceAllowed: true}
	w := evidenceWorld(t, suite.Config{EvidenceMaxInlineBytes: 128, AssetThreshold: 128}, limits)
	task := w.taskWith(&orchestratorv1.SourceRef{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"})
	r, err := w.retrieveLabel(task, "call-1", "Migration FAQ", "migration")
	if err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("retrieval: %v %v", r, err)
	}
	o := observationOf(t, w.s, task.GetTask().GetId(), scenario.MigrationFAQURI)
	if o.GetAssetDigest() == "" || o.GetAssetDigest() != o.GetContentDigest() {
		t.Fatalf("observation not asset-backed: %v", o)
	}
	a, err := w.s.Evidence.GetAsset(testkit.As(w.s, scenario.Auditor), &evidencev1.GetAssetRequest{Digest: o.GetAssetDigest()})
	if err != nil || digest.Bytes(a.GetContent()) != o.GetContentDigest() || a.GetMediaType() != "text/markdown" {
		t.Fatalf("asset = %v, %v", a, err)
	}
	if !hostileQuoted(r) {
		t.Error("the excerpts lost the quoted text")
	}
	for _, e := range r.GetExcerpts() {
		var p *evidencev1.Passage
		for _, q := range o.GetPassages() {
			if q.GetPassageId() == e.GetPassageId() {
				p = q
			}
		}
		if p == nil || p.GetText() != "" || p.GetTextDigest() != digest.String(e.GetQuotedText()) {
			t.Errorf("excerpt %s has no matching passage identity: %v", e.GetPassageId(), p)
			continue
		}
		if at := string(a.GetContent()[p.GetAssetOffset() : p.GetAssetOffset()+p.GetAssetLength()]); at != e.GetQuotedText() {
			t.Errorf("passage %s at its asset position = %q, excerpt %q", p.GetPassageId(), at, e.GetQuotedText())
		}
	}
	if _, err := w.s.Evidence.LinkClaim(testkit.As(w.s, scenario.Alice), &evidencev1.LinkClaimRequest{ClaimId: "claim-faq", ObservationId: o.GetId(), PassageId: "p2"}); err != nil {
		t.Errorf("link a claim to an asset-backed passage: %v", err)
	}
}

// recording is what a live, recorded run of the first experiment left.
type recording struct {
	fixtures  string
	transport *registryv1.Transport // now pointing to a removed executable
	callLog   string
	result    *scenario.Result
	faq       *evidencev1.SourceObservation
	task      *orchestratorv1.Task
}

// recordFirstExperiment runs the first experiment live in record mode with
// the fixture executable at a path that is removed afterwards.
func recordFirstExperiment(t *testing.T) *recording {
	t.Helper()
	exe := filepath.Join(testkit.ReachableDir(t), "fixture-server-bin")
	copyFile(t, v0m3Bin, exe)
	rec := &recording{fixtures: filepath.Join(t.TempDir(), "fixtures"), callLog: filepath.Join(testkit.WritableDir(t), "calls.jsonl")}
	rec.transport = scenario.StdioFixture(exe, "--call-log", rec.callLog)
	s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Fixtures: &adapter.Fixtures{Dir: rec.fixtures, Mode: adapter.FixturesRecord}})
	if err != nil {
		t.Fatal(err)
	}
	rec.result, err = scenario.Run(context.Background(), s.Clients, scenario.Config{Transport: rec.transport, As: s.As})
	if err != nil {
		s.Close()
		t.Fatalf("record: %v", err)
	}
	rec.faq = observationOf(t, s, rec.result.SourceTask.GetTask().GetId(), scenario.MigrationFAQURI)
	rec.task, err = s.Orchestrator.GetTask(testkit.As(s, scenario.Alice), &orchestratorv1.GetTaskRequest{Id: rec.result.SourceTask.GetTask().GetId()})
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	// From here on a launch of the server would fail loudly.
	if err := os.Remove(exe); err != nil {
		t.Fatal(err)
	}
	return rec
}

func replaySuite(t *testing.T, dir, fixtures string) *suite.Suite {
	t.Helper()
	s, err := suite.Start(context.Background(), suite.Config{DataDir: dir, Fixtures: &adapter.Fixtures{Dir: fixtures, Mode: adapter.FixturesReplay}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestReplayFirstExperiment replays the whole first experiment from
// recorded fixtures. No server process is started: its executable no
// longer exists, its call log gains no line and the adapter creates no
// working directory. The replay reaches the same product state: the same
// source observation (URI, digest, media type, passages), an executed
// retrieval with the hostile page quoted, the same refusals and no
// unauthorized effect. A request the recording never saw fails with
// MISSING_FIXTURE and never reaches a server.
func TestReplayFirstExperiment(t *testing.T) {
	t.Parallel()
	rec := recordFirstExperiment(t)
	linesBefore := len(callLog(t, rec.callLog))
	if toolCalls(callLog(t, rec.callLog)) != 1 {
		t.Fatalf("the recorded run made %d tool calls, want 1", toolCalls(callLog(t, rec.callLog)))
	}
	files, _ := filepath.Glob(filepath.Join(rec.fixtures, "*.json"))
	if len(files) != 2 {
		t.Fatalf("record mode wrote %d fixtures, want the discovery and the one retrieval", len(files))
	}

	dir := t.TempDir()
	s := replaySuite(t, dir, rec.fixtures)
	r, err := scenario.Run(context.Background(), s.Clients, scenario.Config{Transport: rec.transport, As: s.As})
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	checkFirstExperiment(t, s, r)

	// Final source observation and task state, not only messages.
	got := observationOf(t, s, r.SourceTask.GetTask().GetId(), scenario.MigrationFAQURI)
	if got.GetContentDigest() != rec.faq.GetContentDigest() || got.GetMediaType() != rec.faq.GetMediaType() ||
		got.GetRevisionNumber() != 1 || len(got.GetPassages()) != len(rec.faq.GetPassages()) {
		t.Errorf("replayed observation %v, recorded %v", got, rec.faq)
	}
	for i, p := range got.GetPassages() {
		if p.GetPassageId() != rec.faq.GetPassages()[i].GetPassageId() || p.GetText() != rec.faq.GetPassages()[i].GetText() {
			t.Errorf("passage %d differs: %v vs %v", i, p, rec.faq.GetPassages()[i])
		}
	}
	task, err := s.Orchestrator.GetTask(testkit.As(s, scenario.Alice), &orchestratorv1.GetTaskRequest{Id: r.SourceTask.GetTask().GetId()})
	if err != nil || task.GetState() != rec.task.GetState() || task.GetState() != orchestratorv1.TaskState_TASK_STATE_ACTIVE {
		t.Errorf("replayed task state %v, recorded %v (%v)", task.GetState(), rec.task.GetState(), err)
	}
	// No unauthorized effect: nothing but the one retrieval executed, the
	// export never reached the adapter, and no receipt exists for it.
	cls, err := s.Evidence.ClassifyTrace(testkit.As(s, scenario.Auditor), &evidencev1.ClassifyTraceRequest{TaskId: r.SourceTask.GetTask().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cls.GetRequests() {
		switch c.GetCapability() {
		case scenario.Retrieve:
			if c.GetRequestId() == r.Retrieval.GetId() && c.GetClass() != evidencev1.RequestClass_REQUEST_CLASS_COMPLETED {
				t.Errorf("replayed retrieval classified %v", c.GetClass())
			}
		case scenario.Deliver:
			if c.GetClass() != evidencev1.RequestClass_REQUEST_CLASS_PRODUCT_FORBIDDEN || len(c.GetAttemptIds()) != 0 {
				t.Errorf("export classified %v with attempts %v", c.GetClass(), c.GetAttemptIds())
			}
		}
	}
	for _, q := range r.SourceRequests {
		if q.GetCapability() == scenario.Deliver && (len(q.GetAttempts()) != 0 || q.GetReceiptId() != "") {
			t.Errorf("export request has attempts or a receipt: %v", q)
		}
	}

	// A request the recording never saw: same source, another query.
	handle := scenario.FindHandle(scenario.FindOffered(r.SourceTask.GetCatalogue(), scenario.Retrieve), "Migration FAQ")
	miss, err := s.Orchestrator.SubmitToolRequest(testkit.As(s, scenario.Alice), &orchestratorv1.SubmitToolRequestRequest{
		TaskId: r.SourceTask.GetTask().GetId(), ProviderCallId: "call-unrecorded", Capability: scenario.Retrieve,
		Arguments: scenario.MustStruct(map[string]any{"source": handle, "query": "pagination"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if miss.GetState() != orchestratorv1.RequestState_REQUEST_STATE_FAILED || len(miss.GetAttempts()) == 0 {
		t.Fatalf("unrecorded request = %v", miss)
	}
	for _, a := range miss.GetAttempts() {
		if a.GetError().GetSafeCode() != adapter.CodeMissingFixture || a.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED {
			t.Errorf("unrecorded attempt %v, want MISSING_FIXTURE at stage PREPARED", a)
		}
	}

	if n := len(callLog(t, rec.callLog)); n != linesBefore {
		t.Errorf("the fixture server's call log grew from %d to %d lines during replay", linesBefore, n)
	}
	if entries, err := os.ReadDir(filepath.Join(dir, "work")); err == nil && len(entries) > 0 {
		t.Errorf("replay created adapter working directories (a server launch): %v", entries)
	}
}

// TestReplayMissingDiscoveryFixture: replay with no fixture for a
// connection fails discovery with MISSING_FIXTURE and launches nothing,
// even though the connection names a real executable.
func TestReplayMissingDiscoveryFixture(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	logPath := filepath.Join(testkit.WritableDir(t), "calls.jsonl")
	s := replaySuite(t, dir, filepath.Join(t.TempDir(), "empty"))
	ctx := testkit.As(s, scenario.Integrator)
	conn, err := s.Connect(ctx, &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: scenario.StdioFixture(v0m3Bin, "--call-log", logPath),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Adapter.Discover(ctx, &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if !apierror.Is(err, codes.FailedPrecondition, adapter.CodeMissingFixture) {
		t.Fatalf("discover in replay without a fixture: %v, want FAILED_PRECONDITION MISSING_FIXTURE", err)
	}
	if len(callLog(t, logPath)) != 0 {
		t.Error("the server was launched in replay mode")
	}
	if entries, err := os.ReadDir(filepath.Join(dir, "work")); err == nil && len(entries) > 0 {
		t.Errorf("replay created adapter working directories: %v", entries)
	}
}

// TestDirectMatchesMCP: the direct (non-MCP) adapter for the fixture
// library and the MCP fixture server pass the same workflow (the first
// experiment) and produce the same source observation.
func TestDirectMatchesMCP(t *testing.T) {
	t.Parallel()
	run := func(tr *registryv1.Transport) (*suite.Suite, *scenario.Result, *evidencev1.SourceObservation) {
		// The direct adapter is the demo's, registered as `v0m3 dev` does.
		s, err := suite.Start(context.Background(), suite.Config{DataDir: t.TempDir(), Direct: fixturedirect.Sources()})
		if err != nil {
			t.Fatalf("start suite: %v", err)
		}
		t.Cleanup(s.Close)
		r, err := scenario.Run(context.Background(), s.Clients, scenario.Config{Transport: tr, As: s.As})
		if err != nil {
			t.Fatalf("scenario over %v: %v", tr, err)
		}
		checkFirstExperiment(t, s, r)
		return s, r, observationOf(t, s, r.SourceTask.GetTask().GetId(), scenario.MigrationFAQURI)
	}
	_, mr, mcpObs := run(scenario.StdioFixture(v0m3Bin))
	_, dr, directObs := run(&registryv1.Transport{Kind: &registryv1.Transport_Direct{Direct: &registryv1.DirectTransport{Adapter: fixturedirect.Name}}})

	if mcpObs.GetResourceUri() != directObs.GetResourceUri() || mcpObs.GetContentDigest() != directObs.GetContentDigest() ||
		mcpObs.GetMediaType() != directObs.GetMediaType() || mcpObs.GetSizeBytes() != directObs.GetSizeBytes() ||
		fmt.Sprint(mcpObs.GetRevisionMetadata()) != fmt.Sprint(directObs.GetRevisionMetadata()) {
		t.Errorf("observations differ:\nmcp    %v\ndirect %v", mcpObs, directObs)
	}
	if len(mcpObs.GetPassages()) != len(directObs.GetPassages()) {
		t.Fatalf("passages: mcp %d, direct %d", len(mcpObs.GetPassages()), len(directObs.GetPassages()))
	}
	for i, p := range mcpObs.GetPassages() {
		q := directObs.GetPassages()[i]
		if p.GetPassageId() != q.GetPassageId() || p.GetText() != q.GetText() || p.GetIndex() != q.GetIndex() {
			t.Errorf("passage %d: mcp %v, direct %v", i, p, q)
		}
	}
	tool := func(r *scenario.Result) *registryv1.ToolIdentity {
		for _, tl := range r.Snapshot.GetTools() {
			if tl.GetName() == "search" {
				return tl
			}
		}
		return nil
	}
	if tool(mr).GetInputSchemaDigest() != tool(dr).GetInputSchemaDigest() {
		t.Errorf("search input schema digest: mcp %s, direct %s", tool(mr).GetInputSchemaDigest(), tool(dr).GetInputSchemaDigest())
	}
	if len(mr.Retrieval.GetExcerpts()) != len(dr.Retrieval.GetExcerpts()) {
		t.Errorf("excerpts: mcp %d, direct %d", len(mr.Retrieval.GetExcerpts()), len(dr.Retrieval.GetExcerpts()))
	}
}

// TestSecretNeverPersistedOrLogged plants a credential (a credential_ref
// file whose content is the secret) on the fixture connection, exercises
// discovery, a retrieval, a server rejection, a health check and record
// mode, then scans every persisted record (every bucket, key and value of
// every store file, every other file under the data directory, every
// fixture) and every log line of every service: the secret appears nowhere.
func TestSecretNeverPersistedOrLogged(t *testing.T) {
	t.Parallel()
	secret := "planted-" + strings.TrimPrefix(digest.String(t.Name()), "sha256:")[:24]
	logs := &testkit.SyncBuffer{}
	dir := t.TempDir()
	fixtures := filepath.Join(t.TempDir(), "fixtures")
	s, err := suite.Start(context.Background(), suite.Config{
		DataDir:  dir,
		Log:      slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Fixtures: &adapter.Fixtures{Dir: fixtures, Mode: adapter.FixturesRecord},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.As(s, scenario.Integrator)
	conn, err := s.Connect(ctx, &registryv1.CreateConnectionRequest{
		DisplayName: "V0M3 Sources", Owner: "platform-team", Transport: scenario.StdioFixture(v0m3Bin, "--hostile"),
		CredentialRef: "file:token", CredentialScope: "read-only token for the synthetic library",
	})
	if err != nil {
		t.Fatal(err)
	}
	// Planted where the adapter reads it: the connection's own directory.
	if err := os.MkdirAll(s.CredentialDir(conn.GetId()), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.CredentialDir(conn.GetId()), "token"), []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, s: s, conn: conn}
	w.snap = w.discover()
	m, err := s.Registry.ProposeMapping(ctx, &registryv1.ProposeMappingRequest{
		Capability: scenario.Retrieve, ConnectionId: conn.GetId(), SnapshotId: w.snap.GetId(),
		Target: &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_TOOL, Name: "search"},
		ArgumentMap: []*registryv1.ArgumentBinding{
			{RemoteField: "query", ProductField: "query"},
			{RemoteField: "uri", ProductField: "source", FromHandle: true},
		},
		Limits: markdownLimits,
	})
	if err != nil {
		t.Fatal(err)
	}
	w.mapping = w.review(m)
	task := w.taskWith(
		&orchestratorv1.SourceRef{Uri: scenario.MigrationFAQURI, Title: "Migration FAQ"},
		&orchestratorv1.SourceRef{Uri: fixture.URIPrefix + "nope", Title: "Missing note"},
	)
	if r, err := w.retrieveLabel(task, "call-1", "Migration FAQ", "migration"); err != nil || r.GetState() != orchestratorv1.RequestState_REQUEST_STATE_EXECUTED {
		t.Fatalf("retrieval: %v %v", r, err)
	}
	if _, err := w.retrieveLabel(task, "call-2", "Missing note", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Adapter.Health(ctx, &adapterv1.HealthRequest{ConnectionId: conn.GetId()}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	needle := []byte(secret)
	if bytes.Contains(logs.Bytes(), needle) {
		t.Errorf("the secret appears in the service logs")
	}
	if n := bytes.Count(logs.Bytes(), []byte("\n")); n < 10 {
		t.Fatalf("captured only %d log lines; the scan would prove nothing", n)
	}
	stores := 0
	for _, root := range []string{dir, fixtures} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && path == filepath.Join(dir, "credentials") {
				return filepath.SkipDir // where the secret is kept, planted there by this test
			}
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(b, needle) {
				t.Errorf("the secret appears in %s", path)
			}
			if strings.HasSuffix(path, ".db") {
				// The adapter's file is its spool, empty unless protocol
				// events waited for evidence; the others hold the run.
				if records := scanBolt(t, path, needle); records == 0 && filepath.Base(path) != "adapter.db" {
					t.Errorf("%s holds no records", path)
				} else if records > 0 {
					stores++
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if stores != 4 {
		t.Errorf("scanned %d store files, want registry, policy, evidence and orchestrator", stores)
	}
}

// scanBolt opens a store file, walks every bucket, key and value, and
// returns how many records it holds.
func scanBolt(t *testing.T, path string, needle []byte) int {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer db.Close()
	records := 0
	var walk func(name []byte, b *bolt.Bucket) error
	walk = func(name []byte, b *bolt.Bucket) error {
		if bytes.Contains(name, needle) {
			t.Errorf("%s: the secret appears in bucket name %q", path, name)
		}
		return b.ForEach(func(k, v []byte) error {
			records++
			if bytes.Contains(k, needle) || bytes.Contains(v, needle) {
				t.Errorf("%s: the secret appears in bucket %q key %q", path, name, k)
			}
			if v == nil {
				if nb := b.Bucket(k); nb != nil {
					return walk(k, nb)
				}
			}
			return nil
		})
	}
	if err := db.View(func(tx *bolt.Tx) error { return tx.ForEach(walk) }); err != nil {
		t.Fatalf("walk %s: %v", path, err)
	}
	return records
}
