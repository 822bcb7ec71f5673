package state

import "sync"

// indexChunk is how many converted resources the parallel index build hands
// from one stage to the next at a time.
const indexChunk = 1024

// indexParallel is the index build of a large ApplyAddresses (a full sync)
// on two cores instead of one: a two-stage pipeline over out, chunk by chunk.
// This goroutine interns each converted resource through the store's
// interner (the conversion workers' interners only validate) and notes
// errors; a second goroutine follows a chunk behind and upserts them into
// the builder, in the same order and with the same upsertWorkload and
// upsertService as the serial build, so the snapshot is the one the serial
// build makes (TestParallelIndexMatchesSerial).
// The second stage reads a chunk only after the first has sent its end, so
// interning happens before indexing. (A split of the index editors over more
// goroutines balanced better on paper but moves every workload between
// cores once per stage.) Removals are applied before, serially. Called with
// s.mu held.
func (s *Store) indexParallel(b *builder, out []converted) []*ResourceError {
	nChunks := (len(out) + indexChunk - 1) / indexChunk
	chunks := make(chan int, nChunks) // end of each chunk the first stage is done with
	var wg sync.WaitGroup
	wg.Go(func() { // the only goroutine that touches b until Wait
		lo := 0
		for hi := range chunks {
			for _, c := range out[lo:hi] {
				switch {
				case c.w != nil:
					b.upsertWorkload(c.w)
				case c.s != nil:
					b.upsertService(c.s)
				}
			}
			lo = hi
		}
	})

	var errs []*ResourceError
	for lo := 0; lo < len(out); lo += indexChunk {
		hi := min(lo+indexChunk, len(out))
		for i := lo; i < hi; i++ {
			c := &out[i]
			switch {
			case c.err != nil:
				errs = append(errs, resourceError(c.name, c.err))
			case c.w != nil:
				s.in.canonWorkload(c.w)
			default:
				s.in.canonService(c.s)
			}
		}
		chunks <- hi
	}
	close(chunks)
	wg.Wait()
	return errs
}

// finishParallel is finish for a large build: the editors' results (which
// sort the edited lists) are made concurrently, each by one goroutine.
func (b *builder) finishParallel() *Snapshot {
	var wg sync.WaitGroup
	var next Snapshot
	wg.Go(func() { next.byNode = b.byNode.result() })
	wg.Go(func() { next.endpoints = b.endpoints.result() })
	wg.Go(func() {
		next.serviceVIP = b.serviceVIP.result()
		next.serviceHst = b.serviceHst.result()
	})
	wg.Go(func() { next.policiesNS = b.policiesNS.result() })
	next.workloads = b.workloads.result()
	next.workloadIP = b.workloadIP.result()
	next.services = b.services.result()
	next.policies = b.policies.result()
	next.servicePfx = b.old.servicePfx
	if b.pfxDirty {
		next.servicePfx = newPrefixTable(b.servicePfx)
	}
	wg.Wait()
	next.Generation = b.old.Generation + 1
	next.changed = make(chan struct{})
	return &next
}
