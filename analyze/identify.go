package analyze

import (
	"runtime"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
)

// ident is a record's identification by one decider's route: what
// Route.Identify returns, and the identity's key in the decider's state.
type ident struct {
	identity []byte
	key      idKey
	version  int64
	digest   canon.Digest
	err      error // bad input: the record would be dead-lettered
}

// identChunk is how many records one identify task takes: enough to
// amortise handing it over, few enough that the decider starts early.
const identChunk = 128

// identifier identifies runs of records on as many goroutines as the
// process has CPUs, for a pass that decides them in order: identifying
// (the canonical form hashed) costs several times what deciding in
// memory does, and is independent from record to record.
type identifier struct {
	byTopic map[string][]*decider
	work    chan *identTask
	wg      sync.WaitGroup
}

// identTask is one chunk of a run to identify.
type identTask struct {
	run    *identRun
	lo, hi int
	done   chan struct{}
}

func newIdentifier(byTopic map[string][]*decider) *identifier {
	ip := &identifier{byTopic: byTopic, work: make(chan *identTask, 1024)}
	for range runtime.GOMAXPROCS(0) {
		ip.wg.Add(1)
		go func() {
			defer ip.wg.Done()
			for t := range ip.work {
				t.do(ip)
			}
		}()
	}
	return ip
}

// close stops the goroutines, once the tasks handed over are done.
func (ip *identifier) close() {
	close(ip.work)
	ip.wg.Wait()
}

// identRun is a run being identified: record i's identifications, one
// per decider of its topic, are idents[at[i]:at[i+1]].
type identRun struct {
	recs   []*kgo.Record
	at     []int32
	idents []ident
	tasks  []identTask
	ip     *identifier
}

// identify starts identifying run and returns it; of waits for a
// record's identifications.
func (ip *identifier) identify(recs []*kgo.Record) *identRun {
	r := &identRun{recs: recs, at: make([]int32, len(recs)+1), ip: ip}
	n := 0
	for i, rec := range recs {
		r.at[i] = int32(n)
		n += len(ip.byTopic[rec.Topic])
	}
	r.at[len(recs)] = int32(n)
	r.idents = make([]ident, n)
	if len(recs) < 2*identChunk {
		t := identTask{run: r, lo: 0, hi: len(recs)}
		t.do(ip) // not worth handing over
		return r
	}
	r.tasks = make([]identTask, (len(recs)+identChunk-1)/identChunk)
	for k := range r.tasks {
		r.tasks[k] = identTask{run: r, lo: k * identChunk, hi: min((k+1)*identChunk, len(recs)), done: make(chan struct{})}
	}
	for k := range r.tasks {
		ip.work <- &r.tasks[k]
	}
	return r
}

// of returns record i's identifications, once they are ready. While
// waiting, the caller identifies chunks itself.
func (r *identRun) of(i int) []ident {
	if r.tasks != nil && i%identChunk == 0 {
		done := r.tasks[i/identChunk].done
	wait:
		for {
			select {
			case <-done:
				break wait
			case t, ok := <-r.ip.work:
				if !ok {
					<-done
					break wait
				}
				t.do(r.ip)
			}
		}
	}
	return r.idents[r.at[i]:r.at[i+1]]
}

func (t *identTask) do(ip *identifier) {
	r := t.run
	for i := t.lo; i < t.hi; i++ {
		rec := r.recs[i]
		out := r.idents[r.at[i]:r.at[i+1]]
		for j, d := range ip.byTopic[rec.Topic] {
			out[j] = d.identify(rec)
		}
	}
	if t.done != nil {
		close(t.done)
	}
}

// identify identifies rec by d's route.
func (d *decider) identify(rec *kgo.Record) ident {
	if err := undecompressable(rec); err != nil {
		return ident{err: err}
	}
	id, version, digest, err := d.route.Identify(rec)
	if err != nil {
		return ident{err: err}
	}
	return ident{identity: id, key: keyOf(id), version: version, digest: digest}
}
