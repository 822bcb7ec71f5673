package testkit

import (
	"io"
	"os"
)

// CopyFile copies src to dst with mode, replacing dst, and writes it back
// to disk before returning: the kernel neither pages out nor drops dirty
// pages, so a binary about to give its pages back (daemon's
// ReleaseStartupCode) must not be run from a file still being written.
func CopyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
