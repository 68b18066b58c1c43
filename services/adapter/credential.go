package adapter

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// maxCredentialBytes bounds a credential file.
const maxCredentialBytes = 16 << 10

// CredentialEnv is the environment variable that carries a connection's
// credential into a local (stdio) server: the only way such a server
// receives it.
const CredentialEnv = "V0M3_CREDENTIAL"

// credentialError says a connection's credential could not be resolved. It
// names the reference, never the value.
type credentialError struct {
	ref string
}

func (e *credentialError) Error() string {
	return fmt.Sprintf("credential %q could not be read", e.ref)
}

// readCredential resolves a connection's credential_ref to the secret it
// names. Supported: "file:/path" (a Kubernetes Secret mounted as a volume
// is a file too). It runs only when a session is opened for an execution,
// discovery or health check, after policy passed for executions; the value
// is held only as long as the transport needs it and is never logged,
// traced, returned or put into an error.
func readCredential(ref string) (string, error) {
	if ref == "" {
		return "", nil
	}
	path, ok := strings.CutPrefix(ref, "file:")
	if !ok || path == "" {
		return "", &credentialError{ref: ref}
	}
	f, err := os.Open(path)
	if err != nil {
		return "", &credentialError{ref: ref}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCredentialBytes+1))
	if err != nil || len(b) > maxCredentialBytes {
		return "", &credentialError{ref: ref}
	}
	v := strings.TrimSpace(string(b))
	if v == "" || strings.ContainsAny(v, "\x00\r\n") {
		return "", &credentialError{ref: ref}
	}
	return v, nil
}
