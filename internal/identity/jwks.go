package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"
)

// keyRefetchInterval is the least time between two fetches of an issuer's
// key set. A token naming a key id the set lacks is how a rotation shows,
// so such a token fetches the set again, but at most this often: a stream
// of forged tokens, each naming a new key id, would otherwise make every
// request fetch from the issuer (go-oidc's RemoteKeySet fetches again on
// every signature that fails). A key the issuer publishes is accepted at
// most this long after the first token that names it.
const keyRefetchInterval = 10 * time.Second

// keyFetchTimeout bounds one fetch of the key set. The fetch is shared by
// the requests waiting on it, so it does not end with the one that began it.
const keyFetchTimeout = 10 * time.Second

// maxKeySetBytes bounds the key set read from the issuer.
const maxKeySetBytes = 1 << 20

// errNoKey is a token whose signature no published key verifies.
var errNoKey = errors.New("no key of the issuer verifies the token's signature")

// errKeysUnavailable is an issuer whose key set could not be fetched while
// none was held: no token can be checked until a fetch succeeds.
var errKeysUnavailable = errors.New("the issuer's keys could not be fetched")

// remoteKeys is an issuer's JWK set fetched over HTTP(S). A token naming a
// key id the set holds is checked against that key alone, without a fetch:
// a bad signature under a known key is a forgery, not a rotation. It
// implements oidc.KeySet.
type remoteKeys struct {
	url    string
	client *http.Client
	now    func() time.Time

	mu   sync.Mutex
	keys []jose.JSONWebKey
	// fetched is when the last fetch began; zero before the first.
	fetched time.Time
	// inflight is closed when the fetch under way ends; nil when none is.
	inflight chan struct{}
	// fetchErr is the last fetch's error, nil after a good one.
	fetchErr error
}

// newRemoteKeys returns the key set served at url; now tells the time
// between fetches.
func newRemoteKeys(url string, now func() time.Time) *remoteKeys {
	return &remoteKeys{url: url, client: &http.Client{Timeout: keyFetchTimeout}, now: now}
}

// VerifySignature implements oidc.KeySet.
func (r *remoteKeys) VerifySignature(ctx context.Context, token string) ([]byte, error) {
	jws, err := jose.ParseSignedCompact(token, algorithms)
	if err != nil {
		return nil, fmt.Errorf("parse the token: %w", err)
	}
	kid := ""
	if len(jws.Signatures) > 0 {
		kid = jws.Signatures[0].Header.KeyID
	}
	keys, err := r.current(ctx, kid)
	if err != nil {
		return nil, err
	}
	for i := range keys {
		if kid == "" || keys[i].KeyID == kid {
			if payload, err := jws.Verify(&keys[i]); err == nil {
				return payload, nil
			}
		}
	}
	return nil, errNoKey
}

// current returns the keys to check a token naming kid against, fetching
// the set first when it lacks kid (or, for a token naming none, when it
// is empty) and the last fetch is keyRefetchInterval old.
func (r *remoteKeys) current(ctx context.Context, kid string) ([]jose.JSONWebKey, error) {
	r.mu.Lock()
	if r.holds(kid) {
		keys := r.keys
		r.mu.Unlock()
		return keys, nil
	}
	if r.inflight == nil && (r.fetched.IsZero() || r.now().Sub(r.fetched) >= keyRefetchInterval) {
		r.fetched, r.inflight = r.now(), make(chan struct{})
		go r.fetch(r.inflight)
	}
	wait := r.inflight
	r.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keys) == 0 && r.fetchErr != nil {
		return nil, fmt.Errorf("%w: %w", errKeysUnavailable, r.fetchErr)
	}
	return r.keys, nil
}

// holds says whether the set has the key a token naming kid needs.
// Called with mu held.
func (r *remoteKeys) holds(kid string) bool {
	if kid == "" {
		return len(r.keys) > 0
	}
	for _, k := range r.keys {
		if k.KeyID == kid {
			return true
		}
	}
	return false
}

// fetch reads the set and closes done. A failed fetch keeps the keys held.
func (r *remoteKeys) fetch(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), keyFetchTimeout)
	defer cancel()
	keys, err := r.get(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.keys = keys
	} else {
		// Logged here, at most once per keyRefetchInterval: while keys
		// are held, no refusal carries this error (a token naming a key
		// not held is refused as TOKEN_SIGNATURE_INVALID).
		slog.Warn("the OIDC issuer's keys could not be fetched; tokens naming a key not held are refused", "url", r.url, "err", err)
	}
	r.fetchErr, r.inflight = err, nil
	close(done)
}

func (r *remoteKeys) get(ctx context.Context) ([]jose.JSONWebKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return nil, fmt.Errorf("fetch the issuer's keys: %w", err)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the issuer's keys: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the issuer's keys: %s answered %s", r.url, resp.Status)
	}
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxKeySetBytes)).Decode(&set); err != nil {
		return nil, fmt.Errorf("fetch the issuer's keys: %s: %w", r.url, err)
	}
	var keys []jose.JSONWebKey
	for _, k := range set.Keys {
		if k.IsPublic() && (k.Use == "" || k.Use == "sig") {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("fetch the issuer's keys: %s publishes no public signing key", r.url)
	}
	return keys, nil
}

var _ oidc.KeySet = (*remoteKeys)(nil)
