package adapter

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	registryv1 "github.com/v0m3/v0m3/proto/v0m3/registry/v1"
)

// maxCredentialBytes bounds a credential file.
const maxCredentialBytes = 16 << 10

// CredentialEnv is the environment variable that carries a connection's
// credential into a local (stdio) server: the only way such a server
// receives it.
const CredentialEnv = "V0M3_CREDENTIAL"

// CodeCredentialRefNotAllowed is the reason of a connection whose
// credential reference names a file outside its own directory under the
// adapter's credential roots: the adapter refuses it without opening it.
const CodeCredentialRefNotAllowed = "CREDENTIAL_REF_NOT_ALLOWED"

// credentialError says a connection's credential could not be resolved. It
// names the reference, never the value.
type credentialError struct {
	ref string
}

func (e *credentialError) Error() string {
	return fmt.Sprintf("credential %q could not be read", e.ref)
}

// credentialRefusedError says a connection's credential reference lies
// outside what the adapter may read for it; nothing was opened.
type credentialRefusedError struct {
	ref, connectionID string
	roots             []string
}

func (e *credentialRefusedError) Error() string {
	return fmt.Sprintf("credential %q is not in this connection's credential directory (%s) under the adapter's credential roots; "+
		"put the file there (e.g. mount the connection's Secret there) and reference it as \"file:<name>\"",
		e.ref, strings.Join(e.dirs(), ", "))
}

func (e *credentialRefusedError) dirs() []string {
	if len(e.roots) == 0 {
		return []string{"no credential roots are configured"}
	}
	d := make([]string, len(e.roots))
	for i, r := range e.roots {
		d[i] = filepath.Join(r, e.connectionID) + string(filepath.Separator)
	}
	return d
}

// isCredentialError reports whether err is a credential that could not be
// resolved, refused or unreadable: neither is retried.
func isCredentialError(err error) bool {
	var ce *credentialError
	var re *credentialRefusedError
	return errors.As(err, &ce) || errors.As(err, &re)
}

// credentialRoots are the directories under which the adapter reads
// credentials: a connection's credential lies in its own directory,
// <root>/<connection id>/, and nowhere else. So a reference can name
// neither another connection's secret nor any file of the adapter's own
// (its data, its ServiceAccount token) nor any host file, whoever set it
// and whoever reviewed it.
type credentialRoots []string

// credentialDirName reports whether id can name a connection's
// credential directory: one plain path component.
func credentialDirName(id string) bool {
	return id != "" && filepath.IsLocal(id) && !strings.ContainsAny(id, `/\`) && id != "." && id != ".."
}

// read resolves a connection's credential_ref to the secret it names.
// Supported: "file:<name>", a file in the connection's directory under a
// root (the first root that has it), or "file:/abs/path" inside such a
// directory. A Kubernetes Secret mounted at <root>/<connection id> is such
// a directory; its symbolic links are followed as long as they stay in it
// (os.Root), never out of it. A reference outside is refused before
// anything is opened.
//
// It runs only when a session is opened for an execution, discovery or
// health check, after policy passed for executions; the value is held only
// as long as the transport needs it and is never logged, traced, returned
// or put into an error.
func (roots credentialRoots) read(connectionID, ref string) (string, error) {
	if ref == "" {
		return "", nil
	}
	path, ok := strings.CutPrefix(ref, "file:")
	if !ok || path == "" {
		return "", &credentialError{ref: ref}
	}
	refused := &credentialRefusedError{ref: ref, connectionID: connectionID, roots: roots}
	if !credentialDirName(connectionID) {
		return "", refused
	}
	found := false
	for _, root := range roots {
		dir := filepath.Join(root, connectionID)
		name, ok := nameWithin(dir, path)
		if !ok {
			continue
		}
		found = true
		v, err := readIn(dir, name)
		if errors.Is(err, fs.ErrNotExist) && !filepath.IsAbs(path) {
			continue // a relative name may be in a later root
		}
		if err != nil {
			return "", &credentialError{ref: ref}
		}
		return v, nil
	}
	if !found {
		return "", refused
	}
	return "", &credentialError{ref: ref}
}

// nameWithin returns path as a name inside dir: a relative path that stays
// inside, or an absolute one under dir. Only the text is decided here;
// os.Root decides the links.
func nameWithin(dir, path string) (string, bool) {
	if !filepath.IsAbs(path) {
		return path, filepath.IsLocal(path)
	}
	rel, err := filepath.Rel(dir, filepath.Clean(path))
	if err != nil || rel == "." || !filepath.IsLocal(rel) {
		return "", false
	}
	return rel, true
}

// readIn reads the regular file name inside dir, refusing any link that
// leads out of dir.
func readIn(dir, name string) (string, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return "", err
	}
	defer r.Close()
	// A FIFO or device would block or never end: only a regular file.
	st, err := r.Stat(name)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", errors.New("not a regular file")
	}
	f, err := r.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCredentialBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxCredentialBytes {
		return "", errors.New("too large")
	}
	v := strings.TrimSpace(string(b))
	if v == "" || strings.ContainsAny(v, "\x00\r\n") {
		return "", errors.New("empty or multi-line")
	}
	return v, nil
}

// newCredentials returns the credentials of one session of conn: read
// only from conn's directory under the adapter's credential roots.
func (s *Server) newCredentials(conn *registryv1.Connection) *credentials {
	return &credentials{roots: s.credRoots, connectionID: conn.GetId()}
}

// DefaultCredentialRoot is the credential root of an adapter working in
// workDir when none is configured: "credentials" beside it (so
// <data dir>/credentials for the suite's <data dir>/work).
func DefaultCredentialRoot(workDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(workDir)), "credentials")
}

// credentialRoots returns the configured roots, absolute and clean,
// without any that overlaps workDir (where local servers write, so a
// server could plant or read a credential there).
func (d Deps) credentialRoots(workDir string, log *slog.Logger) credentialRoots {
	roots := d.CredentialRoots
	if roots == nil {
		roots = []string{DefaultCredentialRoot(workDir)}
	}
	wd, _ := filepath.Abs(workDir)
	out := credentialRoots{}
	for _, r := range roots {
		abs, err := filepath.Abs(r)
		if err != nil || r == "" {
			log.Warn("credential root ignored: not a usable path", "root", r)
			continue
		}
		if within(abs, wd) || within(wd, abs) {
			log.Warn("credential root ignored: it overlaps the adapter's working directory, where local servers write", "root", abs, "work_dir", wd)
			continue
		}
		out = append(out, abs)
	}
	return out
}

// within reports whether path is dir or lies under it.
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && (rel == "." || filepath.IsLocal(rel))
}
