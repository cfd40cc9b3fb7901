package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// What the chaos rows need to bound a dam process's memory and to read an
// input that holds decompression bombs.

// memorySettings are the pipeline settings docs/delivery.md#memory derives
// dam's memory bound from.
type memorySettings struct {
	inFlightBytes, batchBytes, fetchBytes int64 // pipeline.max_in_flight_bytes, max_decompressed_batch_bytes, max_decompressed_fetch_bytes
}

// bound is what records and batches may take with one broker
// (docs/delivery.md#memory): max_in_flight_bytes + 2 × the fetch window +
// 2 × the batch cap + 8 MiB per broker.
func (m memorySettings) bound() int64 {
	return m.inFlightBytes + 2*m.fetchBytes + 2*m.batchBytes + 8<<20
}

// limit is the memory the documentation says suffices for the process
// under GOMEMLIMIT: 1.25 × the bound plus 64 MiB for the process itself.
func (m memorySettings) limit() int64 { return m.bound()*5/4 + 64<<20 }

// yaml is the settings as lines of the configuration's pipeline section.
func (m memorySettings) yaml() string {
	return fmt.Sprintf("  max_in_flight_bytes: %d\n  max_decompressed_batch_bytes: %d\n  max_decompressed_fetch_bytes: %d\n",
		m.inFlightBytes, m.batchBytes, m.fetchBytes)
}

// memoryCgroup makes a cgroup v2 of the test's own, its memory bounded at
// limit bytes (memory.max, and no swap), for a process to start in
// (sidecar.cgroup), removed at the test's end; or returns "" when the
// machine allows none: no cgroup v2, or its memory controller not
// delegated to the test's cgroup. Call it before making the sidecar, so
// that the process is gone before the cgroup is removed.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	root := cgroup2Mount()
	if root == "" {
		return ""
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	var path string
	for line := range strings.SplitSeq(string(own), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			path = p
		}
	}
	parent := filepath.Join(root, path)
	ctl, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
	if err != nil || !slices.Contains(strings.Fields(string(ctl)), "memory") {
		return ""
	}
	dir, err := os.MkdirTemp(parent, "dam-chaos-")
	if err != nil {
		return ""
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	if err := os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Logf("cgroup %s: memory.max: %v; bounding by GOMEMLIMIT alone", dir, err)
		return ""
	}
	_ = os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0o644)
	return dir
}

// cgroup2Mount is where the cgroup v2 hierarchy is mounted, or "".
func cgroup2Mount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source options
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i > 4 && i+1 < len(fields) && fields[i+1] == "cgroup2" {
			return fields[4]
		}
	}
	return ""
}

// cgroupStat returns the value of key in a flat-keyed file of the cgroup
// (memory.events: "oom_kill N"), or of the one-value file when key is "".
func cgroupStat(dir, file, key string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		switch {
		case key == "" && len(f) == 1:
			return strconv.ParseInt(f[0], 10, 64)
		case len(f) == 2 && f[0] == key:
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %q in %q", file, key, b)
}

// peakRSS returns the running process's peak resident set size (VmHWM in
// /proc/PID/status), in bytes: read it before the process exits.
func (s *sidecar) peakRSS() (int64, error) {
	p := s.running()
	if p == nil {
		return 0, errors.New("not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		return 0, err
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			f := strings.Fields(string(v)) // "123456 kB"
			if len(f) != 2 || f[1] != "kB" {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", p.PID())
}

// checkerInflateMax bounds what the checker inflates of one batch of an
// input holding bombs: the load's batches inflate to a few KB, a bomb to
// tens of MiB.
const checkerInflateMax = 16 << 20

// readAround is testkafka.ReadAll for an input that holds decompression
// bombs: it inflates no batch past inflateMax, and returns, beside the
// records it read, the offsets of the batches it could not (each skipped
// whole).
func readAround(brokers, topic string, inflateMax int) ([]*kgo.Record, map[recAt]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, nil, err
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, nil, err
	}
	want := map[int32]int64{}
	parts := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		s, _ := starts.Lookup(topic, o.Partition)
		if o.Offset > s.Offset {
			want[o.Partition] = o.Offset
			parts[o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	if len(want) == 0 {
		return nil, nil, nil
	}
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.MaxDecompressBatchBytes(inflateMax))
	if err != nil {
		return nil, nil, err
	}
	defer rd.Close()
	var out []*kgo.Record
	skipped := map[recAt]bool{}
	done := map[int32]bool{}
	for len(done) < len(want) {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return out, skipped, err
		}
		fs.EachError(func(_ string, p int32, err error) {
			tl, ok := errors.AsType[*kgo.ErrDecompressTooLarge](err)
			if !ok {
				return
			}
			for o := tl.Offset; o < tl.NextOffset; o++ {
				skipped[recAt{p, o}] = true
			}
			rd.SetOffsets(map[string]map[int32]kgo.EpochOffset{topic: {p: {Epoch: tl.Epoch, Offset: tl.NextOffset}}})
			if tl.NextOffset >= want[p] {
				done[p] = true
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < want[r.Partition] {
				out = append(out, r)
			}
			if r.Offset+1 >= want[r.Partition] {
				done[r.Partition] = true
			}
		})
	}
	return out, skipped, nil
}

// bomber produces decompression bombs to the input: each a zstd record
// batch of one record whose value is size bytes of one byte (about 2 KB
// on the wire for 64 MiB, so any max.message.bytes lets it through).
type bomber struct {
	cl    *kgo.Client
	value []byte
}

func newBomber(t *testing.T, brokers string, size int) *bomber {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(inTopic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.ZstdCompression()),
		kgo.BrokerMaxWriteBytes(1<<30), kgo.ProducerBatchMaxBytes(int32(size+1<<20)),
		kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &bomber{cl: cl, value: bytes.Repeat([]byte{'b'}, size)}
}

// drop produces one bomb to partition p and returns where it is.
func (b *bomber) drop(t *testing.T, p int32, i int) recAt {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := b.cl.ProduceSync(ctx, &kgo.Record{Partition: p, Key: fmt.Appendf(nil, "bomb%d", i), Value: b.value}).First()
	if err != nil {
		t.Fatalf("producing a bomb: %v", err)
	}
	return recAt{r.Partition, r.Offset}
}
