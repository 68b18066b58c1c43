package policy

import (
	"context"
	"fmt"
	"os"
	"time"
)

// fileStamp is what the watcher compares to notice a changed policy file.
type fileStamp struct {
	modTime time.Time
	size    int64
}

func stampOf(fi os.FileInfo) fileStamp { return fileStamp{modTime: fi.ModTime(), size: fi.Size()} }

func (a fileStamp) equal(b fileStamp) bool { return a.modTime.Equal(b.modTime) && a.size == b.size }

// Reload re-reads the policy file now. A file that does not parse is
// refused (the error carries its line and column) and the revision in force
// stays. With no policy file configured it does nothing.
func (s *Server) Reload(ctx context.Context) error {
	if s.deps.PolicyFile == "" {
		return nil
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	return s.reloadLocked(ctx)
}

// reloadLocked loads the policy file; reloadMu must be held.
func (s *Server) reloadLocked(ctx context.Context) error {
	file := s.deps.PolicyFile
	// Stat before reading: if the file changes while it is read, the next
	// poll sees a newer stamp and loads it again.
	fi, err := os.Stat(file)
	if err != nil {
		s.log.ErrorContext(ctx, "policy file unreadable; previous revision stays in force", "file", file, "error", err)
		return fmt.Errorf("policy: stat %s: %w", file, err)
	}
	text, err := os.ReadFile(file)
	if err != nil {
		s.log.ErrorContext(ctx, "policy file unreadable; previous revision stays in force", "file", file, "error", err)
		return fmt.Errorf("policy: read %s: %w", file, err)
	}
	s.seen = stampOf(fi)
	s.pending = fileStamp{}

	c, err := compile(file, text, s.now())
	if err != nil {
		attrs := []any{"file", file, "error", err}
		if pe, ok := asParseError(err); ok {
			attrs = append(attrs, "line", pe.Line, "column", pe.Column)
		}
		cur := s.policy.Load()
		if cur == nil {
			s.log.ErrorContext(ctx, "policy refused", attrs...)
			return err
		}
		attrs = append(attrs, "policy_revision_in_force", cur.revision)
		s.log.ErrorContext(ctx, "policy refused; previous revision stays in force", attrs...)
		return err
	}
	if cur := s.policy.Load(); cur != nil && cur.revision == c.revision {
		return nil
	}
	s.policy.Store(c)
	s.log.InfoContext(ctx, "policy loaded", "source", c.source, "policy_revision", c.revision, "policy_ids", c.ids)
	return nil
}

// pollPolicy reloads the policy file when its modification time or size
// changed. A change is loaded once it has been seen unchanged on two polls,
// so a file caught half-written is not put in force.
func (s *Server) pollPolicy(ctx context.Context) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	fi, err := os.Stat(s.deps.PolicyFile)
	if err != nil {
		if !s.statFailed {
			s.log.WarnContext(ctx, "policy file unreadable; previous revision stays in force", "file", s.deps.PolicyFile, "error", err)
			s.statFailed = true
		}
		return
	}
	s.statFailed = false
	st := stampOf(fi)
	if st.equal(s.seen) {
		s.pending = fileStamp{}
		return
	}
	if !st.equal(s.pending) {
		s.pending = st
		return
	}
	// The error is logged by reloadLocked; the old revision stays.
	_ = s.reloadLocked(ctx)
}
