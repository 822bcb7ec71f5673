package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
)

// dumpProc writes what accounts for node i's proxy VmRSS into dir, read
// right after mesh_proxy_rss_mb and before anything asks the proxy for a
// dump: its /proc status, smaps_rollup and smaps, and the resident pages of
// its executable's mappings (node<i>.resident: "<address> <pages>" runs
// from /proc/<pid>/pagemap, to map onto the symbol table with
// `go tool nm -size`).
func (b *bench) dumpProc(i int, dir string) error {
	pid := b.m.Nodes[i].Proxy.PID()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []string{"status", "smaps_rollup", "smaps"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("node%d.%s", i, f)), data, 0o644); err != nil {
			return err
		}
	}
	if err := writeResident(pid, filepath.Join(dir, fmt.Sprintf("node%d.resident", i))); err != nil {
		return fmt.Errorf("resident pages: %w", err)
	}
	return nil
}

// withHeapProfile returns env with GODEBUG's memprofilerate set
// (benchkit.WithHeapProfile), adding GODEBUG when env has none.
func withHeapProfile(env []string) []string {
	out := append([]string(nil), env...)
	for i, kv := range out {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			out[i] = "GODEBUG=" + benchkit.WithHeapProfile(v)
			return out
		}
	}
	return append(out, "GODEBUG="+benchkit.WithHeapProfile(""))
}

// dumpHeap writes node i's heap profile after a collection
// (heap-gc-node<i>.pprof; gc=1 collects first, so it comes after every
// /proc read) and its MemStats text (heap-gc-node<i>.txt). Run the proxies
// with -proxy-env GODEBUG=memprofilerate=N for a finer profile than the
// default one sample per 512 KiB.
func (b *bench) dumpHeap(ctx context.Context, i int, dir string) error {
	n := b.m.Nodes[i].Node
	if err := fetch(ctx, n, "/debug/pprof/heap?gc=1", filepath.Join(dir, fmt.Sprintf("heap-gc-node%d.pprof", i))); err != nil {
		return err
	}
	return fetch(ctx, n, "/debug/pprof/heap?debug=1", filepath.Join(dir, fmt.Sprintf("heap-gc-node%d.txt", i)))
}

// writeResident writes, for every mapping of pid's executable, a header
// line (the maps line) and the runs of its pages present in memory as
// "0x<address> <pages>" lines.
func writeResident(pid int, out string) error {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return err
	}
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	defer maps.Close()
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return err
	}
	defer pm.Close()
	w, err := os.Create(out)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	page := uint64(os.Getpagesize())
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) < 6 || f[5] != exe {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("maps line %q", line)
		}
		fmt.Fprintln(bw, "#", line)
		entries := make([]byte, (end-start)/page*8)
		if _, err := pm.ReadAt(entries, int64(start/page*8)); err != nil && err != io.EOF {
			return err
		}
		var runStart, runLen uint64
		for k := range uint64(len(entries) / 8) {
			present := binary.LittleEndian.Uint64(entries[k*8:])>>63 == 1
			switch {
			case present && runLen > 0:
				runLen++
			case present:
				runStart, runLen = start+k*page, 1
			case runLen > 0:
				fmt.Fprintf(bw, "%#x %d\n", runStart, runLen)
				runLen = 0
			}
		}
		if runLen > 0 {
			fmt.Fprintf(bw, "%#x %d\n", runStart, runLen)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return w.Close()
}
