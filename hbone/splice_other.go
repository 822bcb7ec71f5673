//go:build !linux

package hbone

import "syscall"

const canWaitReadable = false

func waitReadable(syscall.RawConn) error { return nil }
