package benchkit

import (
	"errors"
	"slices"
	"sync"
	"time"
)

// Paced runs conns workers for d, worker i calling do(i) on a fixed
// schedule: rate calls per second over all workers, each worker's calls
// evenly spaced and the workers staggered, so the load is open-loop and
// steady (a slow call delays only that worker's next one). It returns the
// latency of every call, sorted, the wall time from the first scheduled
// call to the last return, and the workers' errors (a worker stops at its
// first).
func Paced(conns, rate int, d time.Duration, do func(i int) error) ([]time.Duration, time.Duration, error) {
	interval := time.Duration(conns) * time.Second / time.Duration(rate)
	lats := make([][]time.Duration, conns)
	errs := make([]error, conns)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			offset := interval * time.Duration(i) / time.Duration(conns)
			lats[i] = make([]time.Duration, 0, int(d/interval)+1)
			for k := 0; ; k++ {
				at := start.Add(offset + time.Duration(k)*interval)
				if !at.Before(end) {
					return
				}
				if w := time.Until(at); w > 0 {
					time.Sleep(w)
				}
				t0 := time.Now()
				if err := do(i); err != nil {
					errs[i] = err
					return
				}
				lats[i] = append(lats[i], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	all := slices.Concat(lats...)
	slices.Sort(all)
	return all, wall, errors.Join(errs...)
}
