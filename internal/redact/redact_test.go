package redact

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

func TestStruct(t *testing.T) {
	t.Parallel()
	in, err := structpb.NewStruct(map[string]any{
		"query": "migration", "api_key": "s1", "API-Key": "s2", "pass_word": "s3", "Authorization": "s4",
		"nested": map[string]any{"refresh_token": "s5", "page": 2, "list": []any{map[string]any{"client_secret": "s6", "limit": 10}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := Struct(in).AsMap()
	for _, k := range []string{"api_key", "API-Key", "pass_word", "Authorization"} {
		if got[k] != Placeholder {
			t.Errorf("%s = %v, want redacted", k, got[k])
		}
	}
	nested := got["nested"].(map[string]any)
	if nested["refresh_token"] != Placeholder || nested["page"] != 2.0 {
		t.Errorf("nested = %v", nested)
	}
	if e := nested["list"].([]any)[0].(map[string]any); e["client_secret"] != Placeholder || e["limit"] != 10.0 {
		t.Errorf("list element = %v", e)
	}
	if got["query"] != "migration" {
		t.Errorf("safe field changed: %v", got["query"])
	}
	if in.AsMap()["api_key"] != "s1" {
		t.Error("Struct changed its input")
	}
	if Struct(nil) != nil {
		t.Error("Struct(nil) != nil")
	}
}

func TestSecretSetting(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, value string
		secret      bool
	}{
		{"GITHUB_TOKEN", "anything-at-all", true},
		{"API_KEY", "abc", true},
		{"db-password", "hunter2", true},
		{"CLIENT_SECRET", "x", true},
		{"SOME_VAR", "ghp_0123456789abcdefghij0123456789abcd", true},
		{"SOME_VAR", "github_pat_11ABCDEFG0123456789_abcdefghijklmnop", true},
		{"SOME_VAR", "sk-proj-0123456789abcdefghijklmnop", true},
		{"SOME_VAR", "AKIAIOSFODNN7EXAMPLE", true},
		{"SOME_VAR", "xoxb-1234567890-abcdefghij", true},
		{"SOME_VAR", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJtYWxsb3J5In0.c2lnbmF0dXJl", true},
		{"SOME_VAR", "Bearer abcdefgh12345678", true},
		{"SOME_VAR", "-----BEGIN RSA PRIVATE KEY-----\nMIIB...", true},
		{"DATABASE_URL", "postgres://app:s3cret@db:5432/app", true},
		{"REDIS_URL", "redis://:s3cret@redis:6379/0", true},
		// Not secrets: empty values, file paths under secret-looking
		// names, ordinary settings.
		{"API_KEY", "", false},
		{"GOOGLE_APPLICATION_CREDENTIALS", "/var/run/secrets/sa.json", false},
		{"TLS_KEY_FILE", "/etc/tls/tls.key", false},
		{"LOG_LEVEL", "debug", false},
		{"FIXTURE_MODE", "test", false},
		{"DATABASE_URL", "postgres://app@db:5432/app", false},
		{"HOME", "/home/app", false},
		{"GREETING", "skeleton key", false},
	}
	for _, tt := range tests {
		if got := SecretSetting(tt.name, tt.value); got != tt.secret {
			t.Errorf("SecretSetting(%q, %q) = %v, want %v", tt.name, tt.value, got, tt.secret)
		}
	}
}

func TestSecretArgs(t *testing.T) {
	t.Parallel()
	const ghp = "ghp_0123456789abcdefghij0123456789abcd"
	tests := []struct {
		name string
		args []string
		want []int
	}{
		{"bare token", []string{"--verbose", ghp}, []int{1}},
		{"option=value", []string{"--api-key=abc123"}, []int{0}},
		{"name=value", []string{"GITHUB_TOKEN=anything"}, []int{0}},
		{"option then value", []string{"--token", "anything", "--port", "8080"}, []int{1}},
		{"single-dash option", []string{"-password", "hunter2"}, []int{1}},
		{"header", []string{"--header", "Authorization: Bearer abcdefgh12345678"}, []int{1}},
		{"url with password", []string{"postgres://app:s3cret@db:5432/app"}, []int{0}},
		{"token-shaped value under any option", []string{"--config=" + ghp}, []int{0}},
		// Not secrets: ordinary options, file paths under secret-looking
		// names, a secret-looking option followed by another option.
		{"ordinary", []string{"--transport", "stdio", "--addr", ":8080", "-y", "@modelcontextprotocol/server-memory"}, nil},
		{"key file path", []string{"--tls-key-file", "/etc/tls/tls.key", "--credentials=/var/run/secrets/sa.json"}, nil},
		{"flag then option", []string{"--no-token", "--read-only"}, nil},
		{"url", []string{"https://example.com/path?q=1"}, nil},
	}
	for _, tt := range tests {
		if got := SecretArgs(tt.args); !slices.Equal(got, tt.want) {
			t.Errorf("%s: SecretArgs(%q) = %v, want %v", tt.name, tt.args, got, tt.want)
		}
	}
}
