package identity_test

import (
	"context"
	"encoding/base64"
	"encoding/json"

	"google.golang.org/grpc/metadata"
)

func metadataCtx(ctx context.Context, kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
