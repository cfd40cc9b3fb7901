package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/internal/testutil/pgtest"
	"github.com/dam-dedup/dam/internal/testutil/tcpproxy"
)

// TestHashBytesIsPostgreSQLHash: the hash a routed decide groups identities
// by is PostgreSQL's hash of their bytes (hashtext hashes a text's bytes
// with it under a deterministic collation), for every length the hash
// treats differently; on Citus it is also Citus's hash of a bytea
// distribution value (worker_hash), for any bytes up to the longest
// identity.
func TestHashBytesIsPostgreSQLHash(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	rng := rand.New(rand.NewPCG(38, 1))
	var texts []string
	var values [][]byte
	for n := range 41 {
		for range 20 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(' ' + rng.IntN(95))
			}
			texts, values = append(texts, string(b)), append(values, b)
		}
	}
	q := `SELECT array_agg(hashtext(v COLLATE "C") ORDER BY n) FROM unnest($1::text[]) WITH ORDINALITY AS u(v, n)`
	var want []int32
	if err := s.Pool().QueryRow(ctx, q, texts).Scan(&want); err != nil {
		t.Fatal(err)
	}
	for i, v := range values {
		if got := dedup.HashBytes(v); got != want[i] {
			t.Fatalf("HashBytes(%q) = %d, PostgreSQL's hash %d", v, got, want[i])
		}
	}
	if !distributed(t, s) {
		return
	}
	// Any bytes, NUL and high bytes included, up to the longest identity.
	for _, n := range []int{0, 1, 11, 12, 13, 255, 1023, dedup.MaxEntityBytes} {
		for range 5 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			values = append(values, b)
		}
	}
	values = append(values, []byte{0}, []byte{0xff, 0xff, 0xff, 0xff}, []byte("\x00\x80\xfe"))
	q = `SELECT array_agg(worker_hash(v) ORDER BY n) FROM unnest($1::bytea[]) WITH ORDINALITY AS u(v, n)`
	if err := s.Pool().QueryRow(ctx, q, values).Scan(&want); err != nil {
		t.Fatal(err)
	}
	for i, v := range values {
		if got := dedup.HashBytes(v); got != want[i] {
			t.Fatalf("HashBytes(%x) = %d, Citus's hash %d", v, got, want[i])
		}
	}
}

// TestShardGroupsAreCitusShards: on Citus, a routed decide groups a batch's
// identities exactly by the shard Citus keeps each in: one group per shard
// holding some, every identity of a group in that shard.
func TestShardGroupsAreCitusShards(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if !distributed(t, s) {
		t.Skip("the shards of Citus (DAM_TEST_CITUS=1)")
	}
	entities := make([][]byte, 2000)
	for i := range entities {
		entities[i] = fmt.Appendf(nil, "tenant-%d:entity-%06d", i%7, i)
	}
	groups, err := dedup.ShardGroups(ctx, s, entities)
	if err != nil || groups == nil {
		t.Fatalf("no shard groups (%v)", err)
	}
	shardOf := shardIDs(ctx, t, s, entities)
	seen := map[int64]bool{}
	n := 0
	for _, g := range groups {
		id := shardOf[g[0]]
		if seen[id] {
			t.Fatalf("shard %d in two groups", id)
		}
		seen[id] = true
		for _, i := range g {
			if shardOf[i] != id {
				t.Fatalf("%s (shard %d) grouped with shard %d", entities[i], shardOf[i], id)
			}
			n++
		}
	}
	if n != len(entities) || len(groups) < 2 {
		t.Fatalf("%d groups holding %d of %d identities", len(groups), n, len(entities))
	}
}

// shardIDs returns the shard of state holding each entity.
func shardIDs(ctx context.Context, t *testing.T, s *dedup.Store, entities [][]byte) []int64 {
	t.Helper()
	var ids []int64
	q := `SELECT array_agg(get_shard_id_for_distribution_column('state', e) ORDER BY n) FROM unnest($1::bytea[]) WITH ORDINALITY AS u(e, n)`
	if err := s.Pool().QueryRow(ctx, q, entities).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestValuesRowsBounded: the placeholders' statement holds every identity
// and at most a quarter more rows (a few statement texts in all), and no
// more than the protocol's parameters allow.
func TestValuesRowsBounded(t *testing.T) {
	sizes := map[int]bool{}
	for n := 1; n <= 4096; n++ {
		r := dedup.ValuesRows(n)
		if r < n || 4*r > 5*n {
			t.Fatalf("%d identities: %d rows", n, r)
		}
		sizes[r] = true
	}
	if len(sizes) > 50 {
		t.Fatalf("%d statement sizes", len(sizes))
	}
	if r := dedup.ValuesRows(100000); r+1 > 65535 {
		t.Fatalf("%d rows: more parameters than a statement may have", r)
	}
}

// TestRoutedDecideMatchesUnrouted: a routed decide (the batch's identities
// grouped by shard, each group locked, read and written by its own
// statements) decides every record and stores every state as the unrouted
// claim does, in each mode, for batches whose identities span every shard;
// on one server, the same with Citus's shapes in one group.
func TestRoutedDecideMatchesUnrouted(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	open := func() *dedup.Store {
		s, err := dedup.Open(ctx, dsn, dedup.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		dedup.SetClaims(s)
		return s
	}
	routed, unrouted := open(), open()
	dedup.SetUnrouted(unrouted)
	rules := []dedup.Rule{{Mode: dedup.LastSeen}, {Mode: dedup.LastSeen, RefreshAfter: time.Minute},
		{Mode: dedup.Window, Window: time.Minute, Sliding: true}, {Mode: dedup.Version}}
	for ri, rule := range rules {
		rng := rand.New(rand.NewPCG(38, uint64(ri)))
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		type run struct {
			s       *dedup.Store
			service string
			p       dedup.Partition
			epoch   int64
			all     []dedup.Decision
		}
		runs := []*run{{s: routed, service: fmt.Sprintf("routed-%d", ri)}, {s: unrouted, service: fmt.Sprintf("unrouted-%d", ri)}}
		for _, r := range runs {
			r.p, r.epoch = partition(t, r.s, r.service)
		}
		next := int64(0)
		for b, n := range []int{1, 300, 17, 1000, 5, 600, 2, 400} {
			var recs []dedup.Record
			for k := range n {
				e := rng.IntN(700)
				recs = append(recs, dedup.Record{Offset: next + int64(k), Entity: fmt.Appendf(nil, "entity-%04d", e),
					Digest: digest(fmt.Sprintf("%d-%d", e, rng.IntN(3))), Version: int64(rng.IntN(5))})
			}
			if b == 3 {
				recs[10] = dedup.Record{Offset: recs[10].Offset, Entity: recs[10].Entity, Invalid: true}
			}
			if b == 3 && distributed(t, routed) {
				es := make([][]byte, len(recs))
				for i := range recs {
					es[i] = recs[i].Entity
				}
				if g, err := dedup.ShardGroups(ctx, routed, es); err != nil || len(g) < 2 {
					t.Fatalf("a batch of %d records in %d shard groups (%v)", n, len(g), err)
				}
			}
			now = now.Add(time.Duration(rng.IntN(40)) * time.Second)
			for _, r := range runs {
				batch := &dedup.Batch{Service: r.service, Rule: rule, Partition: r.p, Epoch: r.epoch, Start: next, End: next + int64(n), Now: now,
					Records: append([]dedup.Record(nil), recs...)}
				out, err := r.s.Decide(ctx, batch, nil)
				if err != nil {
					t.Fatalf("%s: %v", r.service, err)
				}
				r.all = append(r.all, out...)
			}
			next += int64(n)
		}
		for i := range runs[0].all {
			if runs[0].all[i] != runs[1].all[i] {
				t.Fatalf("%s: record %d: routed %v, unrouted %v", rule.Mode, i, runs[0].all[i], runs[1].all[i])
			}
		}
		for e := range 700 {
			a, aerr := routed.GetMode(ctx, runs[0].service, fmt.Appendf(nil, "entity-%04d", e), rule.Mode)
			b, berr := unrouted.GetMode(ctx, runs[1].service, fmt.Appendf(nil, "entity-%04d", e), rule.Mode)
			if errors.Is(aerr, dedup.ErrNotFound) != errors.Is(berr, dedup.ErrNotFound) || (aerr != nil) != (berr != nil) {
				t.Fatalf("%s: entity %d: routed %v, unrouted %v", rule.Mode, e, aerr, berr)
			}
			a.Service, b.Service, a.Topic, b.Topic = "", "", "", ""
			if fmt.Sprint(a) != fmt.Sprint(b) {
				t.Fatalf("%s: entity %d: routed %+v, unrouted %+v", rule.Mode, e, a, b)
			}
		}
	}
}

// TestRoutedDecideAfterShardSplit: on Citus, a decide routed by a shard map
// that a shard split has made stale (a group now spanning two shards)
// still decides every record as it should: the read counts the shards,
// drops the map and has the batch run again unrouted, and the next decide
// reads the new map and routes by it.
func TestRoutedDecideAfterShardSplit(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if !distributed(t, s) {
		t.Skip("a shard split of Citus (DAM_TEST_CITUS=1)")
	}
	p, epoch := partition(t, s, "split")
	var recs []rec
	for i := range 400 {
		recs = append(recs, rec{fmt.Sprintf("entity-%03d", i%200), fmt.Sprintf("c%d", i/300)})
	}
	// 0-199 new, 200-299 duplicates, 300-399 changed.
	want := make([]dedup.Decision, 400)
	for i := range want {
		want[i] = dedup.Forward
		if i >= 200 && i < 300 {
			want[i] = dedup.Duplicate
		}
	}
	got := decideAll(t, s, "split", p, epoch, recs[:100], 100)
	before := dedup.ShardMapShards(s)
	if before < 2 {
		t.Fatalf("no shard map kept after a routed decide (%d shards)", before)
	}
	// Split the shard of state holding entity-000's, with its co-located
	// shards, at the middle of its range.
	var shard int64
	var lo, hi int32
	if err := s.Pool().QueryRow(ctx, `SELECT shardid, shardminvalue::int4, shardmaxvalue::int4 FROM pg_dist_shard
		WHERE shardid = get_shard_id_for_distribution_column('state', 'entity-000'::bytea)`).Scan(&shard, &lo, &hi); err != nil {
		t.Fatal(err)
	}
	var nodes []int32
	if err := s.Pool().QueryRow(ctx, `SELECT array_agg(nodeid ORDER BY nodeid) FROM pg_dist_node WHERE shouldhaveshards AND noderole = 'primary' AND groupid > 0`).Scan(&nodes); err != nil {
		t.Fatal(err)
	}
	mid := int32((int64(lo) + int64(hi)) / 2)
	if _, err := s.Pool().Exec(ctx, `SELECT citus_split_shard_by_split_points($1, ARRAY[$2::text], ARRAY[$3::int, $4::int], 'block_writes')`,
		shard, fmt.Sprint(mid), nodes[0], nodes[len(nodes)-1]); err != nil {
		t.Fatal(err)
	}
	if dedup.ShardMapShards(s) != before {
		t.Fatal("the shard map was read again before a decide")
	}
	got = append(got, decideFrom(t, s, "split", p, epoch, 100, recs[100:])...)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("record %d (%s): %v, want %v", i, recs[i].entity, got[i], want[i])
		}
	}
	// The batch found the map stale (its read counted the shards), dropped
	// it and ran again unrouted; the next decide reads the new one.
	if n := dedup.ShardMapShards(s); n != 0 {
		t.Fatalf("%d shards in the map after the split, want none kept", n)
	}
	more := []rec{{"entity-000", "c2"}, {"entity-001", "c2"}, {"entity-002", "c0"}, {"entity-150", "c1"}}
	got = decideFrom(t, s, "split", p, epoch, 400, more)
	if fmt.Sprint(got) != fmt.Sprint([]dedup.Decision{dedup.Forward, dedup.Forward, dedup.Duplicate, dedup.Duplicate}) {
		t.Fatalf("after the split: %v", got)
	}
	if n := dedup.ShardMapShards(s); n != before+1 {
		t.Fatalf("%d shards in the map after the next decide, want %d", n, before+1)
	}
}

// decideFrom decides recs as one batch at offsets from first on.
func decideFrom(t *testing.T, s *dedup.Store, service string, p dedup.Partition, epoch, first int64, recs []rec) []dedup.Decision {
	t.Helper()
	b := &dedup.Batch{Service: service, Partition: p, Epoch: epoch, Start: first, End: first + int64(len(recs))}
	for i, r := range recs {
		b.Records = append(b.Records, dedup.Record{Offset: first + int64(i), Entity: []byte(r.entity), Digest: digest(r.content)})
	}
	out, err := s.Decide(context.Background(), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestShardMapNotKeptFromLostConnection: on Citus, a shard map read that
// fails because the connection is lost (a network cut, the coordinator
// restarted) is not taken for an unroutable cluster: nothing is kept, and
// the next decide reads the map again and routes by it, instead of
// deciding unrouted until the map's time to live has passed.
func TestShardMapNotKeptFromLostConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	target, rewrite := tcpproxy.PostgresDSN(t, pgtest.DSN(t))
	proxy := tcpproxy.New(t, target)
	s, err := dedup.Open(ctx, rewrite(proxy.Addr()), dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !distributed(t, s) {
		t.Skip("the shards of Citus (DAM_TEST_CITUS=1)")
	}
	p, epoch := partition(t, s, "lostmap")
	// The pool's connection, used just now (not pinged when acquired),
	// is lost before the first decide reads the map over it.
	if _, err := s.Pool().Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	proxy.Reset()
	recs := []rec{{"entity-0", "a"}, {"entity-1", "a"}, {"entity-2", "a"}}
	b := &dedup.Batch{Service: "svc", Partition: p, Epoch: epoch, Start: 0, End: 3}
	for i, r := range recs {
		b.Records = append(b.Records, dedup.Record{Offset: int64(i), Entity: []byte(r.entity), Digest: digest(r.content)})
	}
	if _, err := s.Decide(ctx, b, nil); !errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("decide over a lost connection: %v, want ErrUnavailable", err)
	}
	got := decideAll(t, s, "svc", p, epoch, recs, len(recs))
	if fmt.Sprint(got) != "[forward forward forward]" {
		t.Fatalf("after the lost connection: %v", got)
	}
	if n := dedup.ShardMapShards(s); n < 2 {
		t.Fatalf("%d shards in the map kept after a decide: the lost connection's failed read was kept, the decides run unrouted", n)
	}
}
