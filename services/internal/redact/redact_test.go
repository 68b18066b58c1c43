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
