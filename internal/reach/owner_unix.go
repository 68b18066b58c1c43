//go:build unix

package reach

import (
	"errors"
	"os"
	"syscall"
)

// trustedOwner reports an error unless fi is owned by root or by this
// process's effective user.
func trustedOwner(fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("has no owner information")
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return errors.New("belongs to another user; it is never started")
	}
	return nil
}
