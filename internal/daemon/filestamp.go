package daemon

import (
	"os"
	"syscall"
	"time"
)

// FileStamp is what a reload check compares to tell that a file may have
// changed without reading it. The change time is in it because it moves
// on every write, chmod or rename into place and, unlike the modification
// time, cannot be set back; the inode because a Kubernetes Secret or
// ConfigMap update swaps a symlink, so the new file may have the old size
// and times.
type FileStamp struct {
	size         int64
	mtime, ctime time.Time
	dev, ino     uint64
}

// StampOf is fi's stamp. On a platform without a stat_t only size and
// modification time are compared.
func StampOf(fi os.FileInfo) FileStamp {
	s := FileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino = uint64(st.Dev), st.Ino
		s.ctime = time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	}
	return s
}

// StatStamp stats path and returns its stamp.
func StatStamp(path string) (FileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return FileStamp{}, err
	}
	return StampOf(fi), nil
}
