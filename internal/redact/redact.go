// Package redact is the one rule for what looks secret: fields in
// structured arguments (the adapter applies it before a protocol trace or
// fixture is written, and evidence applies it again to whatever it
// stores, as defense in depth) and literal settings such as a local
// server's environment and command-line arguments (the registry refuses
// those).
package redact

import (
	"net/url"
	"path/filepath"
	"regexp"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// Placeholder replaces the value of every secret-looking field.
const Placeholder = "[redacted]"

// secretKeyParts make a field name look secret. The rule errs toward
// redacting too much: "key" also covers "api_key" and "apikey".
var secretKeyParts = []string{"token", "secret", "password", "key", "credential", "authorization"}

var separators = strings.NewReplacer("_", "", "-", "")

// SecretKey reports whether a field name looks secret. Names are compared
// lower-cased with "-" and "_" removed, so "API-Key" and "pass_word" match.
func SecretKey(name string) bool {
	n := separators.Replace(strings.ToLower(name))
	for _, p := range secretKeyParts {
		if strings.Contains(n, p) {
			return true
		}
	}
	return false
}

// Struct returns a copy of s in which the value of every secret-looking
// field, at any depth (nested objects and lists), is Placeholder. It
// returns nil for nil.
func Struct(s *structpb.Struct) *structpb.Struct {
	if s == nil {
		return nil
	}
	out := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(s.GetFields()))}
	for k, v := range s.GetFields() {
		if SecretKey(k) {
			out.Fields[k] = structpb.NewStringValue(Placeholder)
			continue
		}
		out.Fields[k] = value(v)
	}
	return out
}

func value(v *structpb.Value) *structpb.Value {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		return structpb.NewStructValue(Struct(k.StructValue))
	case *structpb.Value_ListValue:
		l := &structpb.ListValue{Values: make([]*structpb.Value, 0, len(k.ListValue.GetValues()))}
		for _, e := range k.ListValue.GetValues() {
			l.Values = append(l.Values, value(e))
		}
		return structpb.NewListValue(l)
	default:
		return v
	}
}

// secretValuePatterns are the shapes of well-known credentials: provider
// token prefixes, JWTs, PEM private keys, and authorization header values.
var secretValuePatterns = []*regexp.Regexp{
	regexp.MustCompile(`^(gh[pousr]_|github_pat_)[A-Za-z0-9_]{20,}`),                   // GitHub
	regexp.MustCompile(`^glpat-[A-Za-z0-9_-]{20,}`),                                    // GitLab
	regexp.MustCompile(`^xox[abposr]-[A-Za-z0-9-]{10,}`),                               // Slack
	regexp.MustCompile(`^(sk|rk)_(live|test)_[A-Za-z0-9]{16,}`),                        // Stripe
	regexp.MustCompile(`^sk-[A-Za-z0-9_-]{20,}`),                                       // OpenAI, Anthropic and alike
	regexp.MustCompile(`^(AKIA|ASIA)[0-9A-Z]{16}$`),                                    // AWS access key id
	regexp.MustCompile(`^AIza[0-9A-Za-z_-]{35}$`),                                      // Google API key
	regexp.MustCompile(`^eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*$`), // JWT
	regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----`),                           // PEM private key
	regexp.MustCompile(`(?i)^(bearer|basic|token)\s+\S{8,}$`),                          // an Authorization header value
}

// SecretValue reports whether a value looks like a credential whatever
// it is called: a well-known token shape, a JWT, a private key, an
// authorization header value, or a URL carrying a password.
func SecretValue(v string) bool {
	v = strings.TrimSpace(v)
	for _, p := range secretValuePatterns {
		if p.MatchString(v) {
			return true
		}
	}
	if u, err := url.Parse(v); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			return true
		}
	}
	return false
}

// SecretSetting reports whether a configured name=value setting (an
// environment variable, a header) carries a literal secret: a
// secret-looking value under any name, or any value under a
// secret-looking name, except an empty value or an absolute file path
// (where a secret is kept, not the secret itself).
func SecretSetting(name, value string) bool {
	if SecretValue(value) {
		return true
	}
	v := strings.TrimSpace(value)
	if v == "" || (filepath.IsAbs(v) && !strings.ContainsAny(v, " \t")) {
		return false
	}
	return SecretKey(name)
}

// SecretArgs returns the indexes of the command-line arguments that carry
// a literal secret, by the same rule as SecretSetting: a secret-looking
// argument ("ghp_...", "Bearer ..."), a setting written into one argument
// ("--api-key=VALUE", "TOKEN=VALUE", "Authorization: Bearer ..."), or the
// value following a secret-looking option ("--token VALUE"). Arguments are
// readable by anyone who can list processes, so a secret is never one.
func SecretArgs(args []string) []int {
	var out []int
	for i, a := range args {
		if len(out) > 0 && out[len(out)-1] == i {
			continue // already found as an option's value
		}
		if SecretValue(a) {
			out = append(out, i)
			continue
		}
		if name, value, ok := argSetting(a); ok && SecretSetting(name, value) {
			out = append(out, i)
			continue
		}
		// "--token VALUE": the value is the next argument, unless that is
		// another option.
		if name, ok := strings.CutPrefix(a, "-"); ok && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") &&
			!strings.ContainsAny(name, "=: ") && SecretSetting(name, args[i+1]) {
			out = append(out, i+1)
		}
	}
	return out
}

// argSetting splits an argument of the form "--name=value", "name=value"
// or "Name: value" (a header) into name and value.
func argSetting(a string) (name, value string, ok bool) {
	if name, value, ok = strings.Cut(a, "="); ok && name != "" && !strings.ContainsAny(name, " :/") {
		return strings.TrimLeft(name, "-"), value, true
	}
	if name, value, ok = strings.Cut(a, ": "); ok && name != "" && !strings.ContainsAny(name, " =/") {
		return name, value, true
	}
	return "", "", false
}
