package pipeline

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// Header names dam writes.
const (
	HeaderError           = "dam-error"            // dead letter: why the record is bad
	HeaderSourceTopic     = "dam-source-topic"     // dead letter: input topic
	HeaderSourcePartition = "dam-source-partition" // dead letter: input partition
	HeaderSourceOffset    = "dam-source-offset"    // dead letter: input offset
	HeaderDuplicate       = "dam-duplicate"        // shadow mode: "true" on a would-be duplicate
	// HeaderValueDropped is set on a dead letter whose value (and input
	// headers) were left out because Kafka refused the record for good: its
	// value is the dropped value's size in bytes; or, "unknown", because
	// the record's batch inflates past pipeline.max_decompressed_batch_bytes
	// (ErrUndecompressable: nothing of the record was read).
	HeaderValueDropped = "dam-value-dropped"
	// HeaderKeyDropped is set on such a dead letter when the key was left
	// out too, being longer than an identity may be
	// (dedup.MaxEntityBytes): its value is the dropped key's size in bytes.
	HeaderKeyDropped = "dam-key-dropped"
)

// route is one configured route, compiled: its hasher and identity
// extractor are built once and shared by the route's partition workers.
type route struct {
	index    int // in the configuration's routes, for error messages
	service  string
	from     string
	to       string
	dlq      string
	shadow   bool
	preserve bool
	maxSize  int
	// forwardUndecided passes records through undecided while the store is
	// down (on_store_failure: forward) instead of pausing.
	forwardUndecided bool
	hasher           *canon.Hasher
	// entity extracts the identity from the key or a header: the entity or,
	// in window mode, the message id; nil when it comes from a pointer,
	// read by the hasher (identify, modes.go).
	entity entityFunc
	// rule is the route's decision rule; the extraction of identity and
	// version and the window cleanup settings are modes.go's.
	rule         dedup.Rule
	ident        pointerValue // the identity's pointer value, when entity is nil
	identName    string       // where the identity comes from, for errors
	version      versionSource
	npointers    int // values the hasher reads in its pass
	cleanupEvery time.Duration
	cleanupBatch int
}

func compileRoute(rc config.Route, opts ...canon.Option) (*route, error) {
	if err := dedup.CheckService(rc.Service); err != nil {
		return nil, fmt.Errorf("service: %w", err)
	}
	format, err := canon.ParseFormat(rc.Format)
	if err != nil {
		return nil, err
	}
	r := &route{
		service:          rc.Service,
		from:             rc.From,
		to:               rc.To,
		dlq:              rc.DeadLetter,
		shadow:           rc.Shadow,
		preserve:         rc.Partitioning == config.PartitioningPreserve,
		maxSize:          rc.MaxSize,
		forwardUndecided: rc.OnStoreFailure == config.OnStoreFailureForward,
	}
	pointers := r.compileMode(rc)
	h, err := canon.New(append([]canon.Option{
		canon.WithFormat(format),
		canon.WithIgnore(rc.Ignore...),
		canon.WithMaxDepth(rc.MaxDepth),
		canon.WithMaxSize(rc.MaxSize),
		canon.WithValues(pointers...),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", rc.Service, err)
	}
	r.hasher = h
	return r, nil
}

// classify computes a record's identity and digest. A non-nil error means
// bad input: the record is dead-lettered or halts its partition.
func (rt *route) classify(r *kgo.Record) (dedup.Record, error) {
	return rt.classifyIn(r, nil, 0)
}

// classifyIn is classify with identifyIn's batch: the digest comes from
// batch's Flush, under index i. A bad record's Cause is what its dead
// letter says (dam-error), for the decision log to keep.
func (rt *route) classifyIn(r *kgo.Record, batch *canon.Batch, i int) (dedup.Record, error) {
	rec := dedup.Record{Offset: r.Offset}
	if err := undecompressable(r); err != nil {
		rec.Invalid, rec.Cause = true, boundDetail(err.Error())
		return rec, err
	}
	var err error
	rec.Entity, rec.Version, rec.Digest, err = rt.identifyIn(r, batch, i)
	if err != nil {
		rec.Invalid, rec.Cause = true, boundDetail(err.Error())
		return rec, err
	}
	return rec, nil
}

// output builds the record delivered downstream: key, value, headers and
// timestamp kept (but the input's dam-* headers: see inputHeaders); the
// partition kept too with partitioning: preserve.
func (rt *route) output(r *kgo.Record, duplicate bool) *kgo.Record {
	out := new(kgo.Record)
	rt.outputTo(out, r, duplicate)
	return out
}

// outputTo is output into out, a record of a job's slab (one allocation
// for a batch's forwards, not one per record).
func (rt *route) outputTo(out, r *kgo.Record, duplicate bool) {
	*out = kgo.Record{
		Topic:     rt.to,
		Key:       r.Key,
		Value:     r.Value,
		Timestamp: r.Timestamp,
	}
	if rt.preserve {
		out.Partition = r.Partition
	}
	n := len(r.Headers)
	if duplicate {
		n++
	}
	if n > 0 {
		out.Headers = inputHeaders(make([]kgo.RecordHeader, 0, n), r.Headers)
		if duplicate {
			out.Headers = append(out.Headers, kgo.RecordHeader{Key: HeaderDuplicate, Value: []byte("true")})
		}
	}
}

// headerPrefix begins every header dam writes.
const headerPrefix = "dam-"

// inputHeaders appends to dst the input's headers but those named dam-*
// (in any case): only dam writes them, so that a producer cannot forge a
// verdict (dam-duplicate) or a dead letter's source (dam-source-offset) a
// consumer would trust.
func inputHeaders(dst, hs []kgo.RecordHeader) []kgo.RecordHeader {
	for _, h := range hs {
		if len(h.Key) >= len(headerPrefix) && strings.EqualFold(h.Key[:len(headerPrefix)], headerPrefix) {
			continue
		}
		dst = append(dst, h)
	}
	return dst
}

// maxDetail bounds an error's text where dam writes it for people (a
// dead letter's dam-error header, a log line, a halt's error): errors may
// quote input, and input is hostile.
const maxDetail = 512

// boundDetail cuts s to maxDetail bytes, on a character boundary, marking
// the cut with "…".
func boundDetail(s string) string {
	if len(s) <= maxDetail {
		return s
	}
	cut := maxDetail
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// deadLetter builds the dead letter of a bad record, with headers naming the
// error and where the record came from.
func (rt *route) deadLetter(r *kgo.Record, cause error) *kgo.Record {
	h := inputHeaders(make([]kgo.RecordHeader, 0, len(r.Headers)+4), r.Headers)
	h = append(h,
		kgo.RecordHeader{Key: HeaderError, Value: []byte(boundDetail(cause.Error()))},
		kgo.RecordHeader{Key: HeaderSourceTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderSourcePartition, Value: []byte(strconv.FormatInt(int64(r.Partition), 10))},
		kgo.RecordHeader{Key: HeaderSourceOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
	)
	if undecompressable(r) != nil {
		h = append(h, kgo.RecordHeader{Key: HeaderValueDropped, Value: []byte("unknown")})
	}
	return &kgo.Record{Topic: rt.dlq, Key: r.Key, Value: r.Value, Headers: h, Timestamp: r.Timestamp}
}

// refusedLetter builds the dead letter of a record Kafka refused for good
// (err): the key and where it came from, without the value or the input's
// headers, either of which may be what made it too large.
//
// A key longer than an identity may be is left out as well: the letter is
// then bounded whatever the input, and fits any topic.
func (rt *route) refusedLetter(r *kgo.Record, err error) *kgo.Record {
	out := &kgo.Record{Topic: rt.dlq, Key: r.Key, Timestamp: r.Timestamp, Headers: []kgo.RecordHeader{
		{Key: HeaderError, Value: []byte(boundDetail("Kafka refused the record: " + err.Error()))},
		{Key: HeaderValueDropped, Value: []byte(strconv.Itoa(len(r.Value)))},
		{Key: HeaderSourceTopic, Value: []byte(r.Topic)},
		{Key: HeaderSourcePartition, Value: []byte(strconv.FormatInt(int64(r.Partition), 10))},
		{Key: HeaderSourceOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
	}}
	if len(r.Key) > dedup.MaxEntityBytes {
		out.Key = nil
		out.Headers = append(out.Headers, kgo.RecordHeader{Key: HeaderKeyDropped, Value: []byte(strconv.Itoa(len(r.Key)))})
	}
	return out
}

// partitioner sends records of preserve routes to the partition they carry
// and everything else by key with Kafka's default (murmur2, as the Java
// client does).
type partitioner struct {
	preserve map[string]bool
	byKey    kgo.Partitioner
}

func newPartitioner(routes []*route) kgo.Partitioner {
	p := &partitioner{preserve: map[string]bool{}, byKey: kgo.StickyKeyPartitioner(nil)}
	for _, r := range routes {
		if r.preserve {
			p.preserve[r.to] = true
		}
	}
	return p
}

func (p *partitioner) ForTopic(t string) kgo.TopicPartitioner {
	if p.preserve[t] {
		return kgo.ManualPartitioner().ForTopic(t)
	}
	return p.byKey.ForTopic(t)
}
