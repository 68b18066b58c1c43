// Package ids mints local identities and opaque tokens. Identities are
// random, never derived from anything a remote server says.
package ids

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

var enc = base32.StdEncoding.WithPadding(base32.NoPadding)

// New returns prefix + "_" + 16 random bytes in lower-case base32, e.g.
// "conn_k3v...". It panics only if the system's random source fails.
func New(prefix string) string { return prefix + "_" + random(16) }

// Token returns an unguessable opaque token: prefix + "_" + 32 random bytes.
func Token(prefix string) string { return prefix + "_" + random(32) }

func random(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("ids: crypto/rand failed: " + err.Error())
	}
	return strings.ToLower(enc.EncodeToString(b))
}
