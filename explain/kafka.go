package explain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Reading the input: a partition's bounds, the group's committed offset,
// single records and ranges, read_committed like the sidecar, through
// clients made from the Explainer's Kafka client's options.

// bounds are a partition's readable offsets and the group's position.
type bounds struct {
	Start int64 // the log start offset
	End   int64 // the last stable offset: read_committed reads below it
	// Committed is the group's committed offset C, -1 when it has none.
	Committed int64
}

// bounds returns the partition's bounds and group's committed offset.
func (ex *Explainer) bounds(ctx context.Context, group, topic string, part int32) (bounds, error) {
	b := bounds{Committed: -1}
	admin := kadm.NewClient(ex.kafka)
	starts, err := admin.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return b, fmt.Errorf("kafka: listing the start offsets of %s: %w", topic, err)
	}
	s, ok := starts.Lookup(topic, part)
	if !ok {
		return b, fmt.Errorf("kafka: topic %s has no partition %d", topic, part)
	}
	ends, err := admin.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return b, fmt.Errorf("kafka: listing the end offsets of %s: %w", topic, err)
	}
	e, _ := ends.Lookup(topic, part)
	b.Start, b.End = s.Offset, e.Offset
	if group != "" {
		offs, err := admin.FetchOffsets(kadm.RequireStable(ctx), group)
		if errors.Is(err, kerr.GroupIDNotFound) {
			return b, nil // the group never committed
		}
		if err != nil {
			return b, fmt.Errorf("kafka: fetching the committed offsets of group %s: %w", group, err)
		}
		if o, ok := offs.Lookup(topic, part); ok && o.Err == nil && o.At >= 0 {
			b.Committed = o.At
		}
	}
	return b, nil
}

// errUnreadable: the record cannot be read from Kafka any more (or yet).
var errUnreadable = errors.New("not readable")

// readRange returns the committed records of topic/part with offsets in
// [from, to], in offset order (offsets of aborted or compacted records are
// missing). b are the partition's bounds.
func (ex *Explainer) readRange(ctx context.Context, topic string, part int32, from, to int64, b bounds) ([]*kgo.Record, error) {
	if to < b.Start {
		return nil, fmt.Errorf("%s/%d@%d: %w: below the log start offset %d (retention or deletion)", topic, part, to, errUnreadable, b.Start)
	}
	if to >= b.End {
		return nil, fmt.Errorf("%s/%d@%d: %w: at or beyond the end of the partition (%d)", topic, part, to, errUnreadable, b.End)
	}
	from = max(from, b.Start)
	cl, err := kgo.NewClient(append(ex.kafka.Opts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {part: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A batch of the input is hostile: inflated within the sidecar's
		// bound (config.Pipeline.MaxDecompressedBatchBytes), not 1 GiB.
		kgo.MaxDecompressBatchBytes(ex.maxBatch))...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	defer cl.Close()
	var out []*kgo.Record
	last := from - 1 // the highest offset seen
	for last < to {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("kafka: reading %s/%d [%d, %d]: %w", topic, part, from, to, err)
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = err
			}
		})
		if ferr != nil {
			return nil, fmt.Errorf("kafka: reading %s/%d: %w", topic, part, ferr)
		}
		progressed := false
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, rec := range p.Records {
				if rec.Offset > last {
					last, progressed = rec.Offset, true
				}
				if rec.Offset >= from && rec.Offset <= to {
					out = append(out, rec)
				}
			}
			// Aborted records and control batches leave no record: the
			// partition is read up to its stable end.
			if p.LastStableOffset > 0 && p.LastStableOffset-1 >= to && len(p.Records) == 0 {
				last = max(last, p.LastStableOffset-1)
			}
		})
		if !progressed && last < to && last+1 >= b.End {
			break
		}
	}
	return out, nil
}

// readOne returns the record at offset, or an error wrapping errUnreadable
// saying why it cannot be read.
func (ex *Explainer) readOne(ctx context.Context, topic string, part int32, offset int64, b bounds) (*kgo.Record, error) {
	recs, err := ex.readRange(ctx, topic, part, offset, offset, b)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 || recs[0].Offset != offset {
		return nil, fmt.Errorf("%s/%d@%d: %w: no committed record at this offset (compacted, aborted or a transaction marker)", topic, part, offset, errUnreadable)
	}
	return recs[0], nil
}
