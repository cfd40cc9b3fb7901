package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRecordBatchSizeAtTheLimit: recordBatchSize is what a broker measures
// against max.message.bytes, to the byte: a record of exactly the limit is
// accepted, one byte more is refused (MESSAGE_TOO_LARGE), for several key,
// value and header shapes.
func TestRecordBatchSizeAtTheLimit(t *testing.T) {
	const limit = 5000
	c, err := kfake.NewCluster()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(2*limit), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	v := "5000"
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": &v}, "t"); err != nil {
		t.Fatal(err)
	}
	shapes := []func(n int) *kgo.Record{
		func(n int) *kgo.Record { return &kgo.Record{Key: []byte("k"), Value: []byte(strings.Repeat("v", n))} },
		func(n int) *kgo.Record { return &kgo.Record{Value: []byte(strings.Repeat("v", n))} }, // no key
		func(n int) *kgo.Record { return &kgo.Record{Key: []byte(strings.Repeat("k", n))} },   // a tombstone
		func(n int) *kgo.Record {
			return &kgo.Record{Key: []byte("k"), Value: []byte(strings.Repeat("v", n)),
				Headers: []kgo.RecordHeader{{Key: "h1", Value: []byte("x")}, {Key: strings.Repeat("h", 200), Value: []byte(strings.Repeat("y", 300))}}}
		},
	}
	for si, shape := range shapes {
		// The largest n whose record fits.
		n := 0
		for recordBatchSize(shape(n+1)) <= limit {
			n++
		}
		for _, tc := range []struct {
			n  int
			ok bool
		}{{n, true}, {n + 1, false}} {
			r := shape(tc.n)
			r.Topic = "t"
			err := cl.ProduceSync(context.Background(), r).FirstErr()
			if tc.ok && err != nil || !tc.ok && !errors.Is(err, kerr.MessageTooLarge) {
				t.Errorf("shape %d, %d bytes (recordBatchSize %d): produce error %v, want accepted %v", si, tc.n, recordBatchSize(shape(tc.n)), err, tc.ok)
			}
		}
	}
}
