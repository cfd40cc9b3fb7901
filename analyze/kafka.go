package analyze

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/pipeline"
)

// Start is where a KafkaSource starts reading each partition.
type Start struct {
	// Earliest: the log start offset (the zero Start).
	// Offset, when At is false and Time is zero and Offset > 0: this
	// offset (or the log start, if it is later).
	// Time, when not zero: the first offset whose timestamp is at or
	// after it.
	Offset int64
	Time   time.Time
}

// ParseStart parses "earliest", an offset ("1200") or an RFC 3339 time
// ("2030-01-02T03:04:05Z").
func ParseStart(s string) (Start, error) {
	if s == "" || s == "earliest" {
		return Start{}, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return Start{}, fmt.Errorf("offset %d: must not be negative", n)
		}
		return Start{Offset: n}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return Start{}, fmt.Errorf("%q: want earliest, an offset or an RFC 3339 time", s)
	}
	return Start{Time: t}, nil
}

// KafkaSource reads topics from Kafka, read_committed, every partition
// from its start to the end it had when the first Read began (the last
// stable offset): records produced during the analysis are not read.
type KafkaSource struct {
	opts     []kgo.Opt
	topics   []string
	start    Start
	maxBatch int

	// The span, fixed by the first Read: per topic and partition, the
	// first offset and the offset after the last record read.
	from, to map[string]map[int32]int64
	total    int64
	read     bool
}

// NewKafkaSource returns a source reading topics through a client made
// with opts (seed brokers, TLS, SASL), each partition from start.
// maxDecompressedBatch bounds what a compressed batch may inflate to
// (pipeline.max_decompressed_batch_bytes): a batch past it is bad input
// for each of its offsets, as for the sidecar.
func NewKafkaSource(opts []kgo.Opt, topics []string, start Start, maxDecompressedBatch int) *KafkaSource {
	return &KafkaSource{opts: opts, topics: topics, start: start, maxBatch: maxDecompressedBatch}
}

// Rereadable: a topic range can be read again.
func (k *KafkaSource) Rereadable() bool { return true }

// Where returns topic/partition@offset.
func (k *KafkaSource) Where(r *kgo.Record) string {
	return fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset)
}

// Total returns how many offsets the span covers (known once the first
// Read has begun): an upper bound of the records.
func (k *KafkaSource) Total() int64 { return k.total }

// resolve fixes each partition's first offset and end.
func (k *KafkaSource) resolve(ctx context.Context, cl *kgo.Client) error {
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, k.topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("kafka: listing the start offsets of %v: %w", k.topics, err)
	}
	// The last stable offsets: read_committed reads below them.
	ends, err := adm.ListCommittedOffsets(ctx, k.topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("kafka: listing the end offsets of %v: %w", k.topics, err)
	}
	var at kadm.ListedOffsets
	if !k.start.Time.IsZero() {
		if at, err = adm.ListOffsetsAfterMilli(ctx, k.start.Time.UnixMilli(), k.topics...); err == nil {
			err = at.Error()
		}
		if err != nil {
			return fmt.Errorf("kafka: listing the offsets after %s: %w", k.start.Time.Format(time.RFC3339), err)
		}
	}
	k.from, k.to = map[string]map[int32]int64{}, map[string]map[int32]int64{}
	for _, t := range k.topics {
		k.from[t], k.to[t] = map[int32]int64{}, map[int32]int64{}
		if _, ok := ends[t]; !ok {
			return fmt.Errorf("kafka: topic %s does not exist", t)
		}
	}
	ends.Each(func(e kadm.ListedOffset) {
		s, _ := starts.Lookup(e.Topic, e.Partition)
		from := max(s.Offset, k.start.Offset)
		if at != nil {
			if o, ok := at.Lookup(e.Topic, e.Partition); ok {
				from = max(s.Offset, o.Offset)
			}
		}
		from = min(from, e.Offset)
		k.from[e.Topic][e.Partition], k.to[e.Topic][e.Partition] = from, e.Offset
		k.total += e.Offset - from
	})
	return nil
}

// Read reads the span; the first call fixes it (see Source).
func (k *KafkaSource) Read(ctx context.Context, topics []string, fn func([]*kgo.Record) (int, error)) error {
	// One client lists the offsets and reads: the partitions to read are
	// added once the span is known.
	rc, err := kgo.NewClient(append(slices.Clip(k.opts),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A fetch is decided while the next is buffered: franz-go's
		// default (50 MiB a response, decompressed) held about 1 GB at
		// once on a backlog, for no speed. The sidecar's size.
		kgo.FetchMaxBytes(4<<20),
		// A transaction's marker holds an offset, and so ends a
		// partition written transactionally: kept, it says where the
		// reading is (a fetch of nothing is never polled).
		kgo.KeepControlRecords(),
		// The input is hostile: a batch inflates within the sidecar's
		// bound (pipeline.max_decompressed_batch_bytes), not 1 GiB.
		kgo.MaxDecompressBatchBytes(k.maxBatch))...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer rc.Close()
	first := !k.read
	k.read = true
	if first {
		if err := k.resolve(ctx, rc); err != nil {
			return err
		}
	}
	if topics == nil {
		topics = k.topics
	}
	consume := map[string]map[int32]kgo.Offset{}
	next := map[string]map[int32]int64{} // per partition, the next offset expected
	open := 0
	for _, t := range topics {
		for p, from := range k.from[t] {
			if from >= k.to[t][p] {
				continue
			}
			if consume[t] == nil {
				consume[t], next[t] = map[int32]kgo.Offset{}, map[int32]int64{}
			}
			consume[t][p] = kgo.NewOffset().At(from)
			next[t][p] = from
			open++
		}
	}
	if open == 0 {
		return nil
	}
	rc.AddConsumePartitions(consume)
	// done closes a partition: at its end, or where fn stopped.
	done := func(t string, p int32) {
		delete(next[t], p)
		open--
		rc.PauseFetchPartitions(map[string][]int32{t: {p}})
	}
	stop := func() {
		if first {
			// The span ends where each partition stopped.
			for t, ps := range next {
				for p, n := range ps {
					k.to[t][p] = n
				}
			}
		}
	}
	for open > 0 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := rc.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		for _, f := range fs {
			for _, ft := range f.Topics {
				for _, fp := range ft.Partitions {
					n, ok := next[ft.Topic][fp.Partition]
					if !ok {
						continue
					}
					end := k.to[ft.Topic][fp.Partition]
					if fp.Err != nil {
						recs, skip, err := undecompressableRecords(ft.Topic, fp, n, end, k.maxBatch)
						if err != nil {
							return err
						}
						fp.Records = recs
						if skip.Offset >= 0 {
							rc.SetOffsets(map[string]map[int32]kgo.EpochOffset{ft.Topic: {fp.Partition: skip}})
						}
					}
					// The run: the records from next to the end, the
					// markers left out.
					recs := fp.Records
					lo := sort.Search(len(recs), func(i int) bool { return recs[i].Offset >= n })
					hi := sort.Search(len(recs), func(i int) bool { return recs[i].Offset >= end })
					span := recs[lo:max(lo, hi)]
					run := span
					if slices.ContainsFunc(span, isControl) {
						run = slices.DeleteFunc(slices.Clone(span), isControl)
					}
					if len(run) > 0 {
						took, err := fn(run)
						if err != nil {
							// The span ends after the last record taken,
							// not at the next one: the offsets between
							// (compacted, a marker) are read again to
							// know that the end is reached.
							if took > 0 {
								next[ft.Topic][fp.Partition] = run[took-1].Offset + 1
							} else {
								next[ft.Topic][fp.Partition] = n
							}
							stop()
							if errors.Is(err, ErrStop) {
								return nil
							}
							return err
						}
					}
					if len(span) > 0 {
						n = span[len(span)-1].Offset + 1
					}
					// Aborted records and transaction markers leave no
					// record: the partition is read when its stable end is
					// reached.
					if n >= end || len(fp.Records) == 0 && fp.LastStableOffset >= end && fp.Err == nil {
						n = end
					}
					next[ft.Topic][fp.Partition] = n
					if n >= end {
						done(ft.Topic, fp.Partition)
					}
				}
			}
		}
	}
	return nil
}

func isControl(r *kgo.Record) bool { return r.Attrs.IsControl() }

// undecompressableRecords handles a partition's fetch error: a batch past
// the decompression bound becomes records standing for its offsets from
// next (at most to end), bad input as for the sidecar, and skip is where
// to fetch from after it (offset -1: no skip). Any other error but a
// poll's timeout ends the analysis.
func undecompressableRecords(topic string, fp kgo.FetchPartition, next, end int64, batchMax int) ([]*kgo.Record, kgo.EpochOffset, error) {
	none := kgo.EpochOffset{Epoch: -1, Offset: -1}
	var tl *kgo.ErrDecompressTooLarge
	if !errors.As(fp.Err, &tl) {
		if errors.Is(fp.Err, context.DeadlineExceeded) || errors.Is(fp.Err, context.Canceled) {
			return fp.Records, none, nil
		}
		return nil, none, fmt.Errorf("kafka: reading %s/%d: %w", topic, fp.Partition, fp.Err)
	}
	from, to := max(next, tl.Offset), min(tl.NextOffset, end)
	cause := fmt.Errorf("%w: %s/%d: the record batch at offsets [%d, %d) inflates past pipeline.max_decompressed_batch_bytes (%d bytes); none of its records was read",
		pipeline.ErrUndecompressable, topic, fp.Partition, tl.Offset, tl.NextOffset, batchMax)
	ctx := context.WithValue(context.Background(), undecompressableKey{}, cause)
	recs := fp.Records
	for o := from; o < to; o++ {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: fp.Partition, Offset: o, Context: ctx})
	}
	return recs, kgo.EpochOffset{Epoch: tl.Epoch, Offset: max(tl.NextOffset, from)}, nil
}
