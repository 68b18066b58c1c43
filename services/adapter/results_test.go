package adapter

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// structuredSchema is the fixture structured tool's output schema as a
// snapshot observes it (and a mapping copies it).
func structuredSchema(t *testing.T) *structpb.Struct {
	t.Helper()
	b, err := json.Marshal(fixture.StructuredOutputSchema())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return args(t, m)
}

// TestDropDisallowedItems: an item of a media type the mapping does not
// allow fails the whole call, unless the mapping drops such items: then
// each is left out with a diagnostic, the others are returned, and the
// response digest still covers what was left out.
func TestDropDisallowedItems(t *testing.T) {
	t.Parallel()
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		t.Run("fail", func(t *testing.T) {
			resp := execute(t, e, call(t, conn, "mixed", map[string]any{}, &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/plain"}}))
			wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeMediaTypeNotAllowed)
			if len(resp.GetDiagnostics()) != 0 || !strings.Contains(resp.GetError().GetAdapterDetail(), "item 1") {
				t.Errorf("diagnostics %v, detail %q", resp.GetDiagnostics(), resp.GetError().GetAdapterDetail())
			}
		})
		t.Run("drop", func(t *testing.T) {
			limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/plain"}, DropDisallowedItems: true}
			resp := execute(t, e, call(t, conn, "mixed", map[string]any{}, limits))
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 2 {
				t.Fatalf("outcome %v error %v items %v", resp.GetOutcome(), resp.GetError(), resp.GetItems())
			}
			for i, it := range resp.GetItems() {
				if it.GetText() != fixture.MixedText[i] || it.GetIndex() != int32(2*i) {
					t.Errorf("item %d = %v, want %q at index %d", i, it, fixture.MixedText[i], 2*i)
				}
			}
			d := resp.GetDiagnostics()
			if len(d) != 1 || d[0].GetIndex() != 1 || d[0].GetMediaType() != "image/png" || d[0].GetSafeCode() != CodeMediaTypeNotAllowed ||
				!strings.HasPrefix(d[0].GetContentDigest(), "sha256:") || !strings.Contains(d[0].GetAdapterDetail(), "text/plain") {
				t.Fatalf("diagnostics = %v", d)
			}
			// The digest covers the dropped item: the same kept items
			// without it digest differently.
			without, err := responseDigest(resp.GetItems(), nil, nil)
			if err != nil || without == resp.GetResponseDigest() {
				t.Errorf("response digest %s ignores the dropped item (%v)", resp.GetResponseDigest(), err)
			}
		})
		t.Run("drop every item", func(t *testing.T) {
			limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/markdown"}, DropDisallowedItems: true}
			resp := execute(t, e, call(t, conn, "mixed", map[string]any{}, limits))
			if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(resp.GetItems()) != 0 || len(resp.GetDiagnostics()) != 3 {
				t.Errorf("outcome %v items %d diagnostics %v", resp.GetOutcome(), len(resp.GetItems()), resp.GetDiagnostics())
			}
		})
		t.Run("dropped items still count", func(t *testing.T) {
			// max_items bounds what the server sent, not what was kept.
			limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 2, AllowedMediaTypes: []string{"text/plain"}, DropDisallowedItems: true}
			wantFailure(t, execute(t, e, call(t, conn, "mixed", map[string]any{}, limits)), adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeItemLimitExceeded)
		})
	})
}

// TestOutputSchema: a tool result is judged by the tool's reviewed output
// schema: structured content that breaks it, or is missing, fails the call
// as MALFORMED_RESULT with nothing returned; valid content passes.
func TestOutputSchema(t *testing.T) {
	t.Parallel()
	transports(t, func(t *testing.T, e *env, conn *registryv1.Connection) {
		limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/plain"}}
		req := func(shape string, schema *structpb.Struct) *adapterv1.ExecuteRequest {
			r := call(t, conn, "structured", map[string]any{"shape": shape}, limits)
			r.OutputSchema = schema
			return r
		}
		ok := execute(t, e, req(fixture.StructuredValid, structuredSchema(t)))
		if ok.GetOutcome() != adapterv1.Outcome_OUTCOME_OK || len(ok.GetItems()) != 1 ||
			ok.GetStructuredContent().GetFields()["source"].GetStructValue().GetFields()["uri"].GetStringValue() != fixture.URIPrefix+"rate-limits" {
			t.Fatalf("valid result: outcome %v error %v structured %v", ok.GetOutcome(), ok.GetError(), ok.GetStructuredContent())
		}
		for _, shape := range []string{fixture.StructuredWrongType, fixture.StructuredMissing, fixture.StructuredNone} {
			t.Run(shape, func(t *testing.T) {
				resp := execute(t, e, req(shape, structuredSchema(t)))
				wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeMalformedResult)
				if resp.GetStructuredContent() != nil || resp.GetResponseDigest() != "" || resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_RESULT_OBSERVED ||
					!strings.Contains(resp.GetError().GetAdapterDetail(), "output schema") {
					t.Errorf("failed result: structured %v digest %q stage %v detail %q", resp.GetStructuredContent(), resp.GetResponseDigest(), resp.GetStage(), resp.GetError().GetAdapterDetail())
				}
			})
		}
		// Without a reviewed schema, the same broken content is not judged.
		if resp := execute(t, e, req(fixture.StructuredWrongType, nil)); resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
			t.Errorf("without an output schema: %v %v", resp.GetOutcome(), resp.GetError())
		}
	})
}

// TestOutputSchemaRefusedBeforeAnything: a request whose output schema
// cannot judge a result, or that gives one to a resource read, is refused
// before any process starts.
func TestOutputSchemaRefusedBeforeAnything(t *testing.T) {
	t.Parallel()
	for name, edit := range map[string]func(*adapterv1.ExecuteRequest){
		"a remote reference": func(r *adapterv1.ExecuteRequest) {
			r.OutputSchema = args(t, map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"$ref": "https://example.com/x.json"}}})
		},
		"a resource read": func(r *adapterv1.ExecuteRequest) {
			r.Target = &registryv1.RemoteTarget{Kind: registryv1.RemoteKind_REMOTE_KIND_RESOURCE, Name: fixture.URIPrefix + "rate-limits"}
			r.Arguments = nil
			r.OutputSchema = structuredSchema(t)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			conn, log := e.loggedConn(t)
			r := call(t, conn, "structured", map[string]any{"shape": fixture.StructuredValid}, nil)
			edit(r)
			_, err := e.srv.Execute(context.Background(), granted(t, r))
			if apierror.Code(err) != codes.InvalidArgument || !strings.Contains(strings.Join(apierror.Fields(err), ","), "output_schema") {
				t.Fatalf("Execute = %v (fields %v), want INVALID_ARGUMENT on output_schema", err, apierror.Fields(err))
			}
			wantNothingStarted(t, e, log)
		})
	}
}

// TestResultDigestUnchangedWithoutDrops: a result with nothing dropped
// digests as before drops existed, so recorded fixtures keep their digests.
func TestResultDigestUnchangedWithoutDrops(t *testing.T) {
	t.Parallel()
	items := []*adapterv1.ContentItem{{Index: 0, MediaType: "text/plain", Text: "a", ContentDigest: digest.Bytes([]byte("a")), Metadata: map[string]string{}}}
	got, err := responseDigest(items, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := digest.JSON(map[string]any{
		"items":              []any{map[string]any{"index": 0, "uri": "", "media_type": "text/plain", "content_digest": digest.Bytes([]byte("a")), "blob_size": 0, "metadata": map[string]any{}}},
		"structured_content": nil,
	})
	if err != nil || got != want {
		t.Errorf("digest %s, want %s (%v)", got, want, err)
	}
}

// TestReplayJudgesByOutputSchema: a recorded result replayed for a request
// carrying the tool's output schema is judged by it, as a live one is.
func TestReplayJudgesByOutputSchema(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	limits := &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 5, AllowedMediaTypes: []string{"text/plain"}}
	rec := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.Fixtures = &Fixtures{Dir: dir, Mode: FixturesRecord} })
	if resp := execute(t, rec, call(t, rec.stdioConn("--hostile"), "structured", map[string]any{"shape": fixture.StructuredWrongType}, limits)); resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("recorded call: %v %v", resp.GetOutcome(), resp.GetError())
	}
	play := newEnvWith(t, slog.New(slog.DiscardHandler), func(d *Deps) { d.Fixtures = &Fixtures{Dir: dir, Mode: FixturesReplay} })
	conn := play.stdioConn("--hostile")
	if resp := execute(t, play, call(t, conn, "structured", map[string]any{"shape": fixture.StructuredWrongType}, limits)); resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
		t.Fatalf("replay without a schema: %v %v", resp.GetOutcome(), resp.GetError())
	}
	r := call(t, conn, "structured", map[string]any{"shape": fixture.StructuredWrongType}, limits)
	r.OutputSchema = structuredSchema(t)
	wantFailure(t, execute(t, play, r), adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeMalformedResult)
}
