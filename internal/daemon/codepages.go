package daemon

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ReleaseStartupCode gives the executable's pages back to the system once
// start-up is over, so that what stays resident is the code the process
// runs from then on.
//
// Why: the kernel maps a file's pages 64 KiB at a time around each fault
// and reads ahead further, and package initialisation, the first xDS sync
// and the admin servers touch some page of nearly every 64 KiB of a Go
// binary, so 15 of a node proxy's 16 MiB of text, read-only data and
// pclntab stayed resident although a serving proxy runs a fraction of
// them (bench/README, issue 29). MADV_RANDOM first stops the read-ahead
// on later faults; MADV_PAGEOUT then unmaps the pages and reclaims the
// clean ones nothing else maps; POSIX_FADV_DONTNEED drops the file's
// other clean, unmapped pages (what read-ahead or writing the file left).
// Pages another process maps (a second process started from the same
// file) and dirty ones stay.
//
// The memory is freed, not merely unmapped: in e2e the node proxy's mapped
// share of its executable fell 14.3 -> 1.1-3.0 MiB and the file's cached pages
// 15.1 -> 1.1-4.7 MiB (what its other threads read back meanwhile). The
// price is a read from the file the first time a released page is needed
// again.
func ReleaseStartupCode() (CodeRelease, error) {
	var r CodeRelease
	maps, err := executableMappings()
	if err != nil {
		return r, err
	}
	if r.ResidentBefore, err = residentIn(maps); err != nil {
		return r, err
	}
	r.CachedBefore = cachedIn(maps)
	for _, m := range maps {
		for _, advice := range []int{unix.MADV_RANDOM, unix.MADV_PAGEOUT} {
			if _, _, e := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, uintptr(advice)); e != 0 {
				return r, fmt.Errorf("madvise %#x-%#x %d: %w", m.start, m.end, advice, e)
			}
		}
	}
	// What read-ahead (or writing the file) cached but never mapped is
	// not in the page tables MADV_PAGEOUT walks.
	if err := dropCached(); err != nil {
		return r, err
	}
	if r.ResidentAfter, err = residentIn(maps); err != nil {
		return r, err
	}
	// Reading smaps faulted code back in, and a fault reads more of the
	// file than it maps (test binary: 3.9 MiB cached against 1.5 mapped
	// right after); what it read around is dropped again.
	err = dropCached()
	r.CachedAfter = cachedIn(maps)
	return r, err
}

// CodeRelease is what ReleaseStartupCode did, in bytes: the executable's
// mapped pages resident in the process (its share of VmRSS) and its pages
// in the page cache, before and after.
type CodeRelease struct {
	ResidentBefore, ResidentAfter uint64
	CachedBefore, CachedAfter     uint64
}

type mapping struct{ start, end uintptr }

// executableMappings returns the read-only mappings of the process's own
// executable (text, read-only data, pclntab): /proc/self/maps lines whose
// path is /proc/self/exe's target and whose permissions have no w.
func executableMappings() ([]mapping, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || strings.Join(fs[5:], " ") != exe || strings.Contains(fs[1], "w") {
			continue
		}
		a, b, ok := strings.Cut(fs[0], "-")
		s, err1 := strconv.ParseUint(a, 16, 64)
		e, err2 := strconv.ParseUint(b, 16, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("/proc/self/maps: cannot read %q", fs[0])
		}
		out = append(out, mapping{uintptr(s), uintptr(e)})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("/proc/self/maps: no mapping of %s", exe)
	}
	return out, nil
}

// residentIn sums the Rss of maps from /proc/self/smaps.
func residentIn(maps []mapping) (uint64, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	starts := make(map[uintptr]bool, len(maps))
	for _, m := range maps {
		starts[m.start] = true
	}
	var sum uint64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) == 0:
		case !strings.HasSuffix(fs[0], ":"): // a mapping's header: start-end perms ...
			a, _, _ := strings.Cut(fs[0], "-")
			s, err := strconv.ParseUint(a, 16, 64)
			in = err == nil && starts[uintptr(s)]
		case in && fs[0] == "Rss:" && len(fs) >= 2:
			kb, err := strconv.ParseUint(fs[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/self/smaps: %q", sc.Text())
			}
			sum += kb << 10
		}
	}
	return sum, sc.Err()
}

// cachedIn counts the bytes of maps in the page cache (mincore), mapped
// into this process or not.
func cachedIn(maps []mapping) uint64 {
	page := uintptr(os.Getpagesize())
	var n uint64
	for _, m := range maps {
		vec := make([]byte, (m.end-m.start+page-1)/page)
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, m.start, m.end-m.start, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			continue
		}
		for _, v := range vec {
			n += uint64(v & 1)
		}
	}
	return n * uint64(page)
}

// dropCached asks the kernel to drop the executable's clean pages that no
// process maps from the page cache.
func dropCached() error {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise %s: %w", f.Name(), err)
	}
	return nil
}
