package adapter

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/v0m3/v0m3/internal/reach"
	"github.com/v0m3/v0m3/internal/telemetry"
)

// httpDialer reaches a connection's server over MCP streamable HTTP. Every
// response body is read through the meter's limit.
type httpDialer struct {
	url           string
	base          http.RoundTripper
	credentialRef string
	creds         *credentials
	reach         reach.Policy
	// listen opens the standalone server-sent event stream, on which a
	// server sends what it says outside any call (list_changed): for
	// long-lived sessions.
	listen bool
	// oauth, when set, authorizes the session with OAuth 2.1 instead of
	// the static credential (see oauth.go).
	oauth *authorizer
}

// maxRedirects bounds same-origin redirects.
const maxRedirects = 5

// maxStreamResumptions bounds how often one dropped event stream is
// resumed; the call's deadline bounds the waiting too.
const maxStreamResumptions = 3

func (d *httpDialer) open(ctx context.Context, m *meter) (mcp.Transport, func(), error) {
	// A literal address or metadata name is refused before the
	// credential is even read; names are decided at dial time.
	if err := d.reach.CheckURL(d.url); err != nil {
		return nil, nil, err
	}
	secret, err := d.creds.resolve(d.credentialRef)
	if err != nil {
		return nil, nil, err
	}
	client, err := d.client(m, secret)
	if err != nil {
		return nil, nil, err
	}
	t := &mcp.StreamableClientTransport{
		Endpoint:   d.url,
		HTTPClient: client,
		// A call's stream that drops is resumed (after the server's retry
		// delay, with Last-Event-ID) when the server numbered its events:
		// the response arrives on the resumed stream and nothing is sent
		// again. A stream without event ids is not resumed; its call
		// stays an unknown outcome.
		MaxRetries:           maxStreamResumptions,
		DisableStandaloneSSE: !d.listen, // a one-off session needs no server-initiated stream
		MaxEventSize:         -1,        // limitedBody enforces the limit while reading
	}
	if d.oauth != nil {
		t.OAuthHandler = &sessionAuth{a: d.oauth, creds: d.creds, m: m, subject: subjectOf(ctx).name}
	}
	return t, func() {}, nil
}

// client is the HTTP client of one session. It follows a redirect only
// within the endpoint's origin (scheme, host and port): a connection
// reaches only the endpoint that was reviewed, and its credential goes
// nowhere else.
func (d *httpDialer) client(m *meter, secret string) (*http.Client, error) {
	u, err := url.Parse(d.url)
	if err != nil {
		return nil, &reach.Error{Reason: reach.ReasonEndpoint, Detail: "the connection's URL does not parse"}
	}
	origin := originOf(u)
	auth := ""
	if secret != "" {
		auth = "Bearer " + secret
	}
	return &http.Client{
		Transport: &meteredTransport{base: d.base, m: m, origin: origin, authorization: auth, creds: d.creds},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if originOf(req.URL) != origin {
				// The target is remote text: it is not repeated.
				re := &reach.Error{Reason: reach.ReasonEndpoint, Detail: fmt.Sprintf(
					"the server at %s redirected to another origin; a connection reaches only its reviewed endpoint (update the connection's URL if the server moved)", origin)}
				m.refuse(re)
				return re
			}
			if len(via) >= maxRedirects {
				return fmt.Errorf("stopped after %d redirects", maxRedirects)
			}
			return nil
		},
	}, nil
}

// originOf is a URL's origin: scheme://host:port with the default port
// made explicit.
func originOf(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		switch scheme {
		case "https":
			port = "443"
		case "http":
			port = "80"
		}
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// meteredTransport limits response bodies, adds the credential to requests
// for the endpoint's origin only, records when the watched request was
// written and acknowledged, and records a dial the reachability policy
// refused.
type meteredTransport struct {
	base          http.RoundTripper
	m             *meter
	origin        string
	authorization string
	creds         *credentials // scrubs the server's auth challenges
}

func (t *meteredTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	telemetry.InjectHTTP(req.Context(), req.Header) // the governed call's trace continues at the server
	endpoint := originOf(req.URL) == t.origin
	switch {
	case t.authorization != "" && endpoint:
		req.Header.Set("Authorization", t.authorization)
	case !endpoint:
		req.Header.Del("Authorization") // an OAuth token goes to the endpoint's origin only too
	}
	var (
		call   *callMeter
		posted []byte
	)
	if req.Method == http.MethodPost && req.GetBody != nil {
		if rc, err := req.GetBody(); err == nil {
			body, _ := io.ReadAll(io.LimitReader(rc, 1<<20))
			_ = rc.Close()
			posted = body
			if call = t.m.bind(body); call != nil {
				c := call
				trace := &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
					if info.Err == nil {
						c.markSent()
					}
				}}
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
			}
		}
	}
	resp, err := t.base.RoundTrip(req)
	if call == nil && posted != nil && err == nil {
		t.m.wroteCancel(posted)
	}
	if err != nil {
		if re, ok := reach.AsError(err); ok {
			t.m.refuse(re)
		}
		return nil, err
	}
	if call != nil && resp.StatusCode >= 200 && resp.StatusCode < 300 {
		call.acknowledged()
	}
	if endpoint {
		t.m.observeAuth(resp, t.creds)
	}
	body := &limitedBody{rc: resp.Body, m: t.m, call: call}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// Each event is one message: the server's own messages are
		// counted (see maxNotificationsPerCall). A stream no call owns
		// (the standalone stream) lives as long as the session: each
		// event is also bounded on its own.
		body.events = &eventCounter{}
		body.perEvent = call == nil
	}
	if tap := t.m.tap.Load(); tap != nil {
		body.frame = bodyFramerFor(tap, resp.Header.Get("Content-Type"))
	}
	resp.Body = body
	return resp, nil
}
