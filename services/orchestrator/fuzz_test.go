package orchestrator

import (
	"encoding/json"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/v0m3/v0m3/internal/apierror"
	"github.com/v0m3/v0m3/internal/digest"
	"github.com/v0m3/v0m3/services/registry"
)

// FuzzNormalizeArguments feeds arbitrary model-emitted JSON to the argument
// normalizer against every real capability schema. Whatever the model
// sends: nothing panics; a refusal is INVALID_ARGUMENT with a reason; an
// accepted request holds only fields the schema declares, with required
// fields present, and normalizing it again yields the same digest.
func FuzzNormalizeArguments(f *testing.F) {
	for _, seed := range []string{
		`{"source":"h_abc","query":"migration"}`,
		`{"source":"h_abc","query":"migration","path":"/etc/passwd"}`,
		`{"document_revision":31,"profile":4}`,
		`{"document_revision":31.5,"profile":"4"}`,
		`{"artifact":"h_a","destination":"h_b"}`,
		`{"query":""}`, `{}`, `{"source":null}`, `{"link":["x"]}`,
		`{"query":"` + string(make([]byte, 300)) + `"}`,
	} {
		f.Add([]byte(seed))
	}
	caps, err := registry.DefaultCapabilities()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var m map[string]any
		if json.Unmarshal(raw, &m) != nil {
			return
		}
		args, err := structpb.NewStruct(m)
		if err != nil {
			return
		}
		for _, c := range caps {
			norm, err := normalizeArguments(c.GetInputSchema(), args)
			if err != nil {
				if apierror.Code(err) != codes.InvalidArgument || apierror.Reason(err) == "" {
					t.Fatalf("%s: refusal %v is not INVALID_ARGUMENT with a reason", c.GetName(), err)
				}
				continue
			}
			props := c.GetInputSchema().GetFields()["properties"].GetStructValue().GetFields()
			for k := range norm {
				if _, ok := props[k]; !ok {
					t.Fatalf("%s: accepted unknown field %q", c.GetName(), k)
				}
			}
			for _, r := range c.GetInputSchema().GetFields()["required"].GetListValue().GetValues() {
				if _, ok := norm[r.GetStringValue()]; !ok {
					t.Fatalf("%s: accepted without required field %q", c.GetName(), r.GetStringValue())
				}
			}
			d1, err := digest.JSON(norm)
			if err != nil {
				t.Fatalf("%s: digest of normalized arguments: %v", c.GetName(), err)
			}
			again, err := structpb.NewStruct(norm)
			if err != nil {
				t.Fatalf("%s: normalized arguments are not JSON-like: %v", c.GetName(), err)
			}
			norm2, err := normalizeArguments(c.GetInputSchema(), again)
			if err != nil {
				t.Fatalf("%s: normalized arguments refused on a second pass: %v", c.GetName(), err)
			}
			if d2, _ := digest.JSON(norm2); d1 != d2 {
				t.Fatalf("%s: normalization is not idempotent: %s != %s", c.GetName(), d1, d2)
			}
		}
	})
}
