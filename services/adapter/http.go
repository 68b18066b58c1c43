package adapter

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// httpDialer reaches a connection's server over MCP streamable HTTP. Every
// response body is read through the meter's limit.
type httpDialer struct {
	url           string
	base          http.RoundTripper
	credentialRef string
}

func (d *httpDialer) open(ctx context.Context, m *meter) (mcp.Transport, func(), error) {
	secret, err := readCredential(d.credentialRef)
	if err != nil {
		return nil, nil, err
	}
	auth := ""
	if secret != "" {
		auth = "Bearer " + secret
	}
	client := &http.Client{Transport: &meteredTransport{base: d.base, m: m, authorization: auth}}
	t := &mcp.StreamableClientTransport{
		Endpoint:             d.url,
		HTTPClient:           client,
		MaxRetries:           -1,   // a broken call stream is evidence, not something to replay
		DisableStandaloneSSE: true, // one call per session: no server-initiated stream needed
		MaxEventSize:         -1,   // limitedBody enforces the limit while reading
	}
	return t, func() {}, nil
}

// meteredTransport limits response bodies, adds the credential, and
// records when the watched request was written and acknowledged.
type meteredTransport struct {
	base          http.RoundTripper
	m             *meter
	authorization string
}

func (t *meteredTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if t.authorization != "" {
		req.Header.Set("Authorization", t.authorization)
	}
	watched := false
	if req.Method == http.MethodPost && req.GetBody != nil {
		if rc, err := req.GetBody(); err == nil {
			body, _ := io.ReadAll(io.LimitReader(rc, 1<<20))
			_ = rc.Close()
			if t.m.isWatching(body) {
				watched = true
				trace := &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
					if info.Err == nil {
						t.m.wrote(body)
					}
				}}
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
			}
		}
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if watched && resp.StatusCode >= 200 && resp.StatusCode < 300 {
		t.m.acknowledged()
	}
	resp.Body = &limitedBody{rc: resp.Body, m: t.m}
	return resp, nil
}
