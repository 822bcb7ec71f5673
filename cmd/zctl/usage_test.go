package main

import (
	"bytes"
	"errors"
	"flag"
	"net"
	"strings"
	"sync/atomic"
	"testing"
)

// TestSubcommandsUsage: status, connections, log, precheck and waypoint print their
// usage for -h (flags anywhere) and contact nothing, and zctl -h lists them.
func TestSubcommandsUsage(t *testing.T) {
	addr, dialled := countDials(t)
	for _, args := range [][]string{
		{"status", "-h"}, {"status", "--cp-admin", addr, "-h"},
		{"connections", "--admin", addr, "--direction", "in", "-h"},
		{"log", "--admin", addr, "--level", "debug", "-h"}, {"log", "-h", "--reset"},
		{"precheck", "--kubeconfig", "/nonexistent", "-h"},
		{"waypoint", "-h"}, {"waypoint", "apply", "-n", "demo", "--kubeconfig", "/nonexistent", "-h"},
	} {
		var out, errOut bytes.Buffer
		if err := run(args, &out, &errOut); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%q: %v", args, err)
		}
		if !strings.HasPrefix(out.String(), "usage: zctl "+args[0]) || !strings.Contains(out.String(), "flags:") {
			t.Errorf("%q printed no usage: %q", args, out.String())
		}
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("usage dialled %d times", n)
	}
	var out bytes.Buffer
	if err := run([]string{"-h"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"status", "connections", "log", "precheck", "waypoint"} {
		if !strings.Contains(out.String(), "\n  "+c+" ") {
			t.Errorf("zctl -h does not list %s:\n%s", c, out.String())
		}
	}
}

// countDials listens on a loopback port that accepts and closes every
// connection, and returns its address and how many have come.
func countDials(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	dialled := new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), dialled
}
