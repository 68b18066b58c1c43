package policy

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/v0m3/v0m3/internal/ids"
)

// FuzzHandleToken feeds arbitrary strings to the handle-token checks that
// run before any lookup. Whatever a model puts in a handle field: nothing
// panics, only minted-shaped tokens pass, and an error may echo at most
// six bytes of it.
func FuzzHandleToken(f *testing.F) {
	for _, seed := range []string{
		ids.Token("h"), "", "h_", "h_" + strings.Repeat("a", 52), "h_" + strings.Repeat("A", 52),
		"v0m3-sources://notes/private-drafts", "../../etc/passwd", "h_\x00\xff", "ñandú", strings.Repeat("h", 4096),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		ok := wellFormed(token)
		if ok && (len(token) != tokenLen || !strings.HasPrefix(token, "h_") || strings.ToLower(token) != token) {
			t.Fatalf("wellFormed(%q) = true for a token that is not minted-shaped", token)
		}
		p := tokenPrefix(token)
		if !utf8.ValidString(p) {
			t.Fatalf("tokenPrefix(%q) = %q is not valid UTF-8", token, p)
		}
		echoed, err := strconv.Unquote(strings.TrimSuffix(p, "…"))
		if err != nil || len(echoed) > 6 || !strings.HasPrefix(token, echoed) {
			t.Fatalf("tokenPrefix(%q) = %q echoes more than a six-byte prefix (%v)", token, p, err)
		}
		if handleKey(token) == token {
			t.Fatalf("handleKey stored the token itself")
		}
	})
}

func TestMintedTokensAreWellFormed(t *testing.T) {
	t.Parallel()
	for range 100 {
		if tok := ids.Token("h"); !wellFormed(tok) {
			t.Fatalf("minted token %q is not well formed", tok)
		}
	}
}
