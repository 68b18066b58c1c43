package hostguard_test

import (
	"net/http/httptest"
	"testing"

	"github.com/v0m3/v0m3/internal/hostguard"
)

// A request naming another site in Host or Origin is refused: what a DNS
// rebinding attack looks like from the server's side.
func TestCheck(t *testing.T) {
	t.Parallel()
	h := hostguard.New([]string{" V0M3.example ", "", "[::1]"})
	for _, tc := range []struct {
		name, host, origin string
		ok                 bool
	}{
		{"loopback IPv4", "127.0.0.1:7410", "", true},
		{"loopback IPv6", "[::1]:7410", "", true},
		{"localhost", "localhost:7410", "http://localhost:3000", true},
		{"allowed name, any case and port", "v0m3.EXAMPLE:443", "https://v0m3.example", true},
		{"rebound name", "attacker.example", "", false},
		{"foreign origin", "127.0.0.1:7410", "https://attacker.example", false},
		{"opaque origin", "127.0.0.1:7410", "null", false},
		{"private address", "10.0.0.8:7410", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("POST", "http://x/mcp", nil)
			r.Host = tc.host
			if tc.origin != "" {
				r.Header.Set("Origin", tc.origin)
			}
			if err := h.Check(r); (err == nil) != tc.ok {
				t.Errorf("Check(host %q, origin %q) = %v; want ok=%v", tc.host, tc.origin, err, tc.ok)
			}
		})
	}
}
