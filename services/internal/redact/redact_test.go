package redact

import (
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
