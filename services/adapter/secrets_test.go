package adapter

import (
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/v0m3/v0m3/demo/fixture"
	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/testkit"
	adapterv1 "github.com/v0m3/v0m3/proto/v0m3/adapter/v1"
	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// TestEchoedCredentialIsScrubbed: a server echoes its credential in every
// place a result, an error and a listing can carry text, raw and encoded.
// Nothing the adapter returns, traces, records or logs carries it; the
// marker shows where it was; digests match the scrubbed content.
func TestEchoedCredentialIsScrubbed(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"stdio", "http"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var logs testkit.SyncBuffer
			e := newEnvLog(t, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			secret, ref := e.plantSecret(t)
			conn := e.httpConn(httpURL)
			if kind == "stdio" {
				conn = e.stdioConn("--hostile")
			}
			conn = e.registry.add(&registryv1.Connection{Transport: conn.GetTransport(), CredentialRef: ref})
			// What a careless server sends, and what must not survive.
			forbidden := []string{
				secret,
				base64.StdEncoding.EncodeToString([]byte(secret)),
				base64.StdEncoding.EncodeToString([]byte("svc-account:" + secret)),
				secret[:12], // a prefix left by truncation
			}
			var seen []string
			see := func(m proto.Message) { seen = append(seen, prototext.Format(m)) }

			for _, where := range fixture.LeakPlaces {
				var limits *registryv1.Limits
				if where == "elicit_form" {
					// Accepted with its defaults: the answer is recorded.
					limits = &registryv1.Limits{MaxResponseBytes: 64 << 10, MaxItems: 10, Elicitation: registryv1.ElicitationPolicy_ELICITATION_POLICY_ACCEPT_DEFAULTS}
				}
				req := call(t, conn, "leak", map[string]any{"where": where}, limits)
				req.TaskId = "task_leak"
				resp := execute(t, e, req)
				see(resp)
				text := prototext.Format(resp)
				switch where {
				case "tool_error":
					wantFailure(t, resp, adapterv1.Outcome_OUTCOME_INVALID_REQUEST, CodeToolError)
				case "rpc_error", "long_error":
					wantFailure(t, resp, adapterv1.Outcome_OUTCOME_UNKNOWN, "JSONRPC_-32001")
				default:
					if resp.GetOutcome() != adapterv1.Outcome_OUTCOME_OK {
						t.Fatalf("%s: outcome %v %v", where, resp.GetOutcome(), resp.GetError())
					}
					for _, it := range resp.GetItems() {
						if it.GetBlobSize() == 0 && it.GetContentDigest() != digest.Bytes([]byte(it.GetText())) {
							t.Errorf("%s: item %d digest %s does not match its (scrubbed) text", where, it.GetIndex(), it.GetContentDigest())
						}
					}
				}
				// The marker shows the credential was there and was
				// replaced, not that the content was dropped.
				if where != "long_error" && !strings.Contains(text, RedactedCredential) {
					t.Errorf("%s: no %q in the response: %s", where, RedactedCredential, text)
				}
			}
			if sc := execute(t, e, call(t, conn, "leak", map[string]any{"where": "structured"}, nil)).GetStructuredContent().AsMap(); sc["echo"] != RedactedCredential || sc[RedactedCredential] == nil {
				t.Errorf("structured content = %v, want the credential replaced in values and keys", sc)
			}

			snap, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
			if err != nil {
				t.Fatal(err)
			}
			see(snap)
			found := false
			for _, tool := range snap.GetTools() {
				if tool.GetName() == "leak" {
					found = strings.Contains(tool.GetDescription(), "Configured with credential "+RedactedCredential)
				}
			}
			if !found {
				t.Errorf("the leak tool's description does not show the scrubbed credential: %v", snap.GetTools())
			}
			e.registry.mu.Lock()
			for _, s := range e.registry.snapshots {
				see(s)
			}
			e.registry.mu.Unlock()
			e.evidence.mu.Lock()
			if len(e.evidence.events) < len(fixture.LeakPlaces) {
				t.Errorf("%d trace events, want one per call", len(e.evidence.events))
			}
			for _, ev := range e.evidence.events {
				see(ev)
			}
			e.evidence.mu.Unlock()
			seen = append(seen, logs.String())
			for i, s := range seen {
				for _, f := range forbidden {
					if strings.Contains(s, f) {
						t.Errorf("observation %d carries the credential (form %q): %s", i, f, s)
					}
				}
			}
		})
	}
}

func TestCredentialsScrubForms(t *testing.T) {
	t.Parallel()
	c := &credentials{}
	const v = "s3cr3t-Value/with+chars&more"
	c.add(v)
	for _, in := range []string{
		v,
		"Bearer " + v,
		base64.StdEncoding.EncodeToString([]byte(v)),
		base64.URLEncoding.EncodeToString([]byte(v)),
		base64.StdEncoding.EncodeToString([]byte("u:" + v + ":tail")), // at an offset inside a longer text
		base64.StdEncoding.EncodeToString([]byte("us:" + v)),
		base64.RawURLEncoding.EncodeToString([]byte("use:" + v)),
		"token=" + strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(v, "/", "%2F"), "+", "%2B"), "&", "%26"),
		"0x" + strings.ToUpper("733363723374"), // too short a fragment: kept
	} {
		got := c.text(in)
		if strings.Contains(in, "0x") {
			if got != in {
				t.Errorf("an unrelated short text changed: %q -> %q", in, got)
			}
			continue
		}
		if !strings.Contains(got, RedactedCredential) {
			t.Errorf("text(%q) = %q, want the credential replaced", in, got)
		}
	}
	// Inside encoded JSON, where an encoder escaped characters of it.
	raw := []byte(`{"a":"x s3cr3t-Value/with+chars\u0026more y"}`)
	if !c.inJSON(raw) {
		t.Errorf("inJSON missed the HTML-escaped form in %s", raw)
	}
	type msg struct {
		A string `json:"a"`
	}
	out, err := scrubJSON(c, &msg{A: "x " + v + " y"})
	if err != nil || out.A != "x "+RedactedCredential+" y" {
		t.Errorf("scrubJSON = %+v, %v", out, err)
	}
	var none *credentials
	if none.text(v) != v {
		t.Error("no credentials changed text")
	}
}

// headerRecorder is a real HTTP server that records every request's
// Authorization header.
type headerRecorder struct {
	*httptest.Server
	mu   sync.Mutex
	auth []string
}

func newHeaderRecorder(t *testing.T, next http.Handler) *headerRecorder {
	t.Helper()
	r := &headerRecorder{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auth = append(r.auth, req.Header.Get("Authorization"))
		r.mu.Unlock()
		if next == nil {
			_, _ = io.Copy(io.Discard, req.Body)
			http.Error(w, "not an MCP server", http.StatusNotFound)
			return
		}
		next.ServeHTTP(w, req)
	}))
	t.Cleanup(func() {
		// A connection the adapter (closed after this) still holds would
		// keep Close waiting five minutes.
		r.CloseClientConnections()
		r.Close()
	})
	return r
}

func (r *headerRecorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.auth...)
}

// redirectTo answers every request with a 307 to target.
func redirectTo(target string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target, http.StatusTemporaryRedirect)
	})
}

// TestAuthorizationNeverCrossesOrigins: server A redirects to server B
// (another port: another origin). The adapter does not follow, B receives
// nothing, and even a client made to follow sends B no Authorization.
// Within one origin, a redirect is followed with the credential.
func TestAuthorizationNeverCrossesOrigins(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	secret, ref := e.plantSecret(t)
	b := newHeaderRecorder(t, nil)
	a := newHeaderRecorder(t, redirectTo(b.URL+"/mcp"))
	conn := e.registry.add(&registryv1.Connection{CredentialRef: ref, Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: a.URL + "/mcp"}}}})

	resp := execute(t, e, call(t, conn, "whoami", map[string]any{}, nil))
	wantFailure(t, resp, adapterv1.Outcome_OUTCOME_FORBIDDEN, CodeEndpointNotAllowed)
	if resp.GetStage() != adapterv1.DeliveryStage_DELIVERY_STAGE_PREPARED {
		t.Errorf("stage %v, want PREPARED: the call was never sent", resp.GetStage())
	}
	_, err := e.srv.Discover(testkit.AsService(context.Background(), identity.Operator), &adapterv1.DiscoverRequest{ConnectionId: conn.GetId()})
	if !apierror.Is(err, codes.FailedPrecondition, CodeEndpointNotAllowed) {
		t.Errorf("Discover through a cross-origin redirect: %v", err)
	}
	if got := b.seen(); len(got) != 0 {
		t.Errorf("the other origin received %d requests: %q", len(got), got)
	}
	if got := a.seen(); len(got) == 0 || got[0] != "Bearer "+secret {
		t.Errorf("the configured origin received %q, want its credential", got)
	}

	// The header rule holds on its own: a client made to follow the
	// redirect still sends the other origin no credential.
	d := &httpDialer{url: a.URL + "/mcp", base: e.srv.httpTransport, reach: e.srv.reach}
	client, err := d.client(newMeter(1<<20), secret)
	if err != nil {
		t.Fatal(err)
	}
	client.CheckRedirect = nil
	r, err := client.Post(a.URL+"/mcp", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Body.Close()
	if got := b.seen(); len(got) != 1 || got[0] != "" {
		t.Errorf("followed to the other origin, it received Authorization %q, want one request without it", got)
	}

	// Same origin: followed, with the credential.
	mux := http.NewServeMux()
	s, err := fixture.NewServer(fixture.Options{Hostile: true})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	mux.Handle("/old", redirectTo("/mcp"))
	same := newHeaderRecorder(t, mux)
	moved := e.registry.add(&registryv1.Connection{CredentialRef: ref, Transport: &registryv1.Transport{
		Kind: &registryv1.Transport_StreamableHttp{StreamableHttp: &registryv1.StreamableHTTPTransport{Url: same.URL + "/old"}}}})
	if got := textOf(t, execute(t, e, call(t, moved, "whoami", map[string]any{}, nil))); got != fixture.CredentialDigest(secret) {
		t.Errorf("after a same-origin redirect the server saw credential %s, want the planted one's", got)
	}
}
