package dedup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Routing a decide's statements to the shards on Citus. A statement that
// carries a batch's identities (an array, or rows from unnest) runs on
// every shard they fall in: INSERT ... SELECT FROM unnest goes through the
// coordinator (a COPY into an intermediate result per shard, then an
// INSERT ... SELECT from it per shard), and a read by `entity = ANY($2)`
// sends every shard the whole array. Grouped by shard, the identities go
// each to its own shard only, by router statements (one task, the group's
// identities only): per shard group, the placeholders of new identities by
// a multi-row INSERT ... VALUES (an INSERT ... SELECT would go through the
// coordinator), the read that locks every identity (Citus refuses a
// SELECT ... FOR UPDATE over several shards, not over one), and the
// rewrite of the changed identities.
//
// The grouping is computed here, with the hash Citus applies to the
// distribution column (PostgreSQL's hash of a bytea, hash_bytes) and the
// hash ranges of state's shards (pg_dist_shard; versions and window_ids are
// co-located with it), read once and kept. It is only a grouping: Citus
// still routes every statement by the values it carries, so a stale range
// table (a shard split since) cannot send an identity to the wrong shard.
// A group that spans two shards then makes a plain statement multi-shard
// (correct, slower), and the locking read refused (Citus refuses a
// multi-shard SELECT ... FOR UPDATE): the decide runs again unrouted and
// the next one reads the ranges again (Decide). The ranges are also read
// again every shardMapTTL.

// shardMapTTL bounds how long a range table is used before it is read again.
const shardMapTTL = 5 * time.Minute

// shardMap is the hash ranges of the shards, in increasing order: shard k
// holds the hashes in [mins[k], maxs[k]]. A nil map routes nothing.
type shardMap struct {
	mins, maxs []int32
	loaded     time.Time
}

// oneShard is the map of one server running Citus's shapes (SetClaims):
// every identity in one group.
var oneShard = &shardMap{mins: []int32{math.MinInt32}, maxs: []int32{math.MaxInt32}}

// shard returns the index of the shard holding e.
func (m *shardMap) shard(e []byte) int {
	if len(m.mins) == 1 {
		return 0
	}
	h := hashBytes(e)
	// The last shard whose minimum is at most h; the ranges cover every
	// hash (checked when read).
	return sort.Search(len(m.mins), func(k int) bool { return m.mins[k] > h }) - 1
}

// groups returns the indexes of entities by shard, in shard order, each
// group in the order of entities (key order).
func (m *shardMap) groups(entities [][]byte) [][]int {
	if len(m.mins) == 1 {
		all := make([]int, len(entities))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	of := make([]int32, len(entities))
	count := make([]int, len(m.mins))
	for i, e := range entities {
		k := m.shard(e)
		of[i] = int32(k)
		count[k]++
	}
	var groups [][]int
	at := make([]int, len(m.mins)) // the group of each shard, +1
	for k, n := range count {
		if n > 0 {
			groups = append(groups, make([]int, 0, n))
			at[k] = len(groups)
		}
	}
	for i, k := range of {
		g := at[k] - 1
		groups[g] = append(groups[g], i)
	}
	return groups
}

// sqlShardMap reads state's shard ranges, and Citus's hash of the probes
// ($1): the hash computed here must be the server's (it is, on a
// little-endian server).
const sqlShardMap = `SELECT array_agg(shardminvalue::int4 ORDER BY shardminvalue::int4),
	array_agg(shardmaxvalue::int4 ORDER BY shardminvalue::int4),
	(SELECT array_agg(worker_hash(p) ORDER BY n) FROM unnest($1::bytea[]) WITH ORDINALITY AS u(p, n))
	FROM pg_dist_shard WHERE logicalrelid = to_regclass('state')`

// sqlShardCount counts state's shards: a routed decide's first run reads
// it with the identities, to learn of a split (its statements are not
// refused when a group spans shards, as a claim's locking read is).
const sqlShardCount = `SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = to_regclass('state')`

// hashProbes are values of every length the hash treats differently (the
// 12-byte blocks, each length of the tail).
var hashProbes = func() [][]byte {
	var p [][]byte
	for n := 0; n <= 25; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(31*n + 7*i + 1)
		}
		p = append(p, b)
	}
	return p
}()

// shardRouting returns the shard map a Citus decide groups its identities
// by, reading it over conn when none is kept or it is older than
// shardMapTTL; nil when the identities cannot be grouped (the ranges do
// not cover every hash, the server's hash is not this one, the catalog
// cannot be read): the decide then runs unrouted.
func (s *Store) shardRouting(ctx context.Context, conn *pgx.Conn) *shardMap {
	if m := s.shards.Load(); m != nil && time.Since(m.loaded) < shardMapTTL {
		if len(m.mins) == 0 {
			return nil
		}
		return m
	}
	m, err := readShardMap(ctx, conn)
	if err != nil {
		if ctx.Err() != nil || conn.IsClosed() {
			// The caller gone, or the connection lost (pgx closes it on
			// a network error): nothing learned of the cluster, nothing
			// kept; the next decide reads the map again.
			return nil
		}
		// Not routable (an error of the catalog's, not of the
		// connection): keep that answer until the next reading.
		m = &shardMap{}
	}
	m.loaded = time.Now()
	s.shards.Store(m)
	if len(m.mins) == 0 {
		return nil
	}
	return m
}

// forgetShards drops the kept shard map: the next routed decide reads it
// again.
func (s *Store) forgetShards() { s.shards.Store(nil) }

func readShardMap(ctx context.Context, conn *pgx.Conn) (*shardMap, error) {
	var mins, maxs, probes []int32
	if err := conn.QueryRow(ctx, sqlShardMap, byteaArray(hashProbes)).Scan(&mins, &maxs, &probes); err != nil {
		return nil, err
	}
	for i, p := range hashProbes {
		if i >= len(probes) || probes[i] != hashBytes(p) {
			return nil, fmt.Errorf("dedup: Citus's hash of %x is not %d", p, hashBytes(p))
		}
	}
	if len(mins) == 0 || len(mins) != len(maxs) || mins[0] != math.MinInt32 || maxs[len(maxs)-1] != math.MaxInt32 {
		return nil, fmt.Errorf("dedup: shard ranges %v..%v do not cover every hash", mins, maxs)
	}
	for k := 1; k < len(mins); k++ {
		if maxs[k-1] == math.MaxInt32 || mins[k] != maxs[k-1]+1 {
			return nil, fmt.Errorf("dedup: shard ranges %v..%v are not contiguous", mins, maxs)
		}
	}
	return &shardMap{mins: mins, maxs: maxs}, nil
}

// hashBytes is PostgreSQL's hash_bytes (src/common/hashfn.c: Bob Jenkins's
// lookup3, as a little-endian server computes it), the hash of a bytea
// (hashvarlena) and so Citus's hash of a bytea distribution column.
func hashBytes(k []byte) int32 {
	n := uint32(len(k))
	a := 0x9e3779b9 + n + 3923095
	b, c := a, a
	for len(k) >= 12 {
		a += binary.LittleEndian.Uint32(k)
		b += binary.LittleEndian.Uint32(k[4:])
		c += binary.LittleEndian.Uint32(k[8:])
		a -= c
		a ^= bits.RotateLeft32(c, 4)
		c += b
		b -= a
		b ^= bits.RotateLeft32(a, 6)
		a += c
		c -= b
		c ^= bits.RotateLeft32(b, 8)
		b += a
		a -= c
		a ^= bits.RotateLeft32(c, 16)
		c += b
		b -= a
		b ^= bits.RotateLeft32(a, 19)
		a += c
		c -= b
		c ^= bits.RotateLeft32(b, 4)
		b += a
		k = k[12:]
	}
	// The last 0 to 11 bytes; the lowest byte of c is reserved for the
	// length (which is not added: PostgreSQL's variant).
	switch len(k) {
	case 11:
		c += uint32(k[10]) << 24
		fallthrough
	case 10:
		c += uint32(k[9]) << 16
		fallthrough
	case 9:
		c += uint32(k[8]) << 8
		fallthrough
	case 8:
		b += uint32(k[7]) << 24
		fallthrough
	case 7:
		b += uint32(k[6]) << 16
		fallthrough
	case 6:
		b += uint32(k[5]) << 8
		fallthrough
	case 5:
		b += uint32(k[4])
		fallthrough
	case 4:
		a += uint32(k[3]) << 24
		fallthrough
	case 3:
		a += uint32(k[2]) << 16
		fallthrough
	case 2:
		a += uint32(k[1]) << 8
		fallthrough
	case 1:
		a += uint32(k[0])
	}
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return int32(c)
}

// The placeholders of a routed claim: a multi-row INSERT ... VALUES of a
// shard group's identities. Its text depends on
// the number of rows, so the rows are padded, repeating the last identity
// (ON CONFLICT DO NOTHING lets a row repeat), to one of a few sizes: the
// store's prepared statements stay few. A statement holds at most
// maxValuesRows rows.
const maxValuesRows = 4096

// valuesRows returns the number of rows of the statement holding n
// identities: n up to 8, else n rounded up to a quarter of the largest
// power of two below it (a quarter more rows at most, four sizes per
// doubling), at most maxValuesRows.
func valuesRows(n int) int {
	if n <= 8 {
		return n
	}
	step := 1 << (bits.Len(uint(n-1)) - 3) // a quarter of the largest power of two below n
	return min((n+step-1)/step*step, maxValuesRows)
}

var valuesSQL sync.Map // of valuesKey: the statement's text

type valuesKey struct {
	head string
	rows int
}

// placeholdersSQL returns head (`INSERT INTO t (service, key, ...) VALUES`)
// followed by rows rows ($1, $k, row...) and ON CONFLICT DO NOTHING.
func placeholdersSQL(head, row string, rows int) string {
	k := valuesKey{head + row, rows}
	if s, ok := valuesSQL.Load(k); ok {
		return s.(string)
	}
	var b strings.Builder
	b.WriteString(head)
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(" ($1, $")
		b.WriteString(strconv.Itoa(i + 2))
		b.WriteString(row)
		b.WriteByte(')')
	}
	b.WriteString(" ON CONFLICT DO NOTHING")
	s, _ := valuesSQL.LoadOrStore(k, b.String())
	return s.(string)
}

// placeholders is the head (`INSERT INTO t (service, key, ...) VALUES`)
// and the rest of a row after its key of the placeholders' statement.
type placeholders struct{ head, row string }

// queue queues the placeholder rows of es (see maxValuesRows): a new
// identity gets a row, an existing one is left as it is, to be locked by
// the read.
func (ph placeholders) queue(rt1 *pgx.Batch, service string, es [][]byte) {
	for start := 0; start < len(es); start += maxValuesRows {
		chunk := es[start:min(start+maxValuesRows, len(es))]
		rows := valuesRows(len(chunk))
		args := make([]any, 1, rows+1)
		args[0] = service
		for i := range rows {
			args = append(args, chunk[min(i, len(chunk)-1)])
		}
		rt1.Queue(placeholdersSQL(ph.head, ph.row, rows), args...)
	}
}

// groupEntities returns the entities of a group.
func (ids *identities) groupEntities(g []int) byteaArray {
	es := make(byteaArray, len(g))
	for k, i := range g {
		es[k] = ids.entities[i]
	}
	return es
}

// byGroup splits is (indexes into entities, in key order) by shard group,
// in group order, leaving out the empty ones.
func (ids *identities) byGroup(is []int) [][]int {
	if len(ids.groups) == 1 {
		return [][]int{is}
	}
	of := ids.groupOf()
	split := make([][]int, len(ids.groups))
	for _, i := range is {
		split[of[i]] = append(split[of[i]], i)
	}
	out := split[:0]
	for _, g := range split {
		if len(g) > 0 {
			out = append(out, g)
		}
	}
	return out
}

// groupOf returns the group of each entity.
func (ids *identities) groupOf() []int32 {
	if ids.group == nil {
		ids.group = make([]int32, len(ids.entities))
		for g, is := range ids.groups {
			for _, i := range is {
				ids.group[i] = int32(g)
			}
		}
	}
	return ids.group
}

// queueReads queues the read sql ($1 the service, $2 the identities) of
// every identity, scanning its rows with scan: one statement, or, routed,
// per shard group in shard order its read, after its placeholders (ph) for
// a routed claim. Every decide so locks shard after shard, each shard's
// identities in key order, and sends only router statements: Citus then
// takes none of the shard locks by which it serializes multi-shard writes
// (citus.enable_deadlock_prevention), and decides of other partitions run
// beside it.
func (ids *identities) queueReads(rt1 *pgx.Batch, service, sql string, ph placeholders, scan func(pgx.Rows) error) {
	if ids.groups != nil && !ids.claim {
		sql = strings.Replace(sql, " FROM ", sqlInDoubt, 1)
	}
	sql = ids.sourceSQL(sql)
	if ids.groups == nil {
		rt1.Queue(sql, service, byteaArray(ids.entities)).Query(scan)
		return
	}
	for _, g := range ids.groups {
		es := ids.groupEntities(g)
		if ph.head != "" {
			ph.queue(rt1, service, es)
		}
		rt1.Queue(sql, service, es).Query(scan)
	}
}

// errStaleShards marks a routed decide refused because a shard group
// spans shards: the shard map is stale.
var errStaleShards = errors.New("dedup: decide: the shard map is stale")

// refused reports Citus refusing a statement (feature_not_supported).
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeNotSupported
}

// A routed decide's first run (tables.go) reads without locking, as on
// one server, and inserts its new identities by a multi-row INSERT ...
// VALUES per shard group (an INSERT ... SELECT FROM unnest would go
// through the coordinator). The rows are padded like the placeholders',
// so the statement says ON CONFLICT DO NOTHING and counts the rows it
// inserted: fewer than the group's new identities means a concurrent
// decider created one of them meanwhile, a lost race (rowChangedMsg), and
// the batch runs again as a routed claim, which locks.

// valuesInsert is the shape of a mode's routed insert of new identities.
type valuesInsert struct {
	// head is `INSERT INTO t (columns) VALUES`.
	head string
	// row is one row: $1 to $c are the arguments at common, each `?` the
	// row's element of the array argument at the same place in arrays.
	row string
	// common and arrays are positions in the arguments of the mode's
	// writes (queueChanged's args).
	common, arrays []int
}

var insertSQL sync.Map // of valuesKey: the statement's text

// sql returns the statement of rows rows: the rows' common arguments
// first, then how many rows the group has ($c+1), then each row's own.
func (vi valuesInsert) sql(rows int) string {
	k := valuesKey{vi.head + vi.row, rows}
	if s, ok := insertSQL.Load(k); ok {
		return s.(string)
	}
	c := len(vi.common)
	var b strings.Builder
	b.WriteString(`WITH w AS (`)
	b.WriteString(vi.head)
	n := c + 2
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte(' ')
		for _, r := range vi.row {
			if r != '?' {
				b.WriteRune(r)
				continue
			}
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			n++
		}
	}
	count := "$" + strconv.Itoa(c+1) + "::int"
	b.WriteString(` ON CONFLICT DO NOTHING RETURNING 1) SELECT CASE WHEN count(*) = ` + count + ` THEN 0 ELSE ('` +
		rowChangedMsg + `: ' || count(*) || ' of ' || ` + count + ` || ' new rows inserted')::int END FROM w`)
	s, _ := insertSQL.LoadOrStore(k, b.String())
	return s.(string)
}

// queue queues the insert of the identities whose arguments args holds
// (queueChanged's), maxValuesRows rows a statement at most.
func (vi valuesInsert) queue(rt2 *pgx.Batch, args []any) {
	n := arrayLen(args[vi.arrays[0]])
	for start := 0; start < n; start += maxValuesRows {
		end := min(start+maxValuesRows, n)
		rows := valuesRows(end - start)
		a := make([]any, 0, len(vi.common)+1+rows*len(vi.arrays))
		for _, p := range vi.common {
			a = append(a, args[p])
		}
		a = append(a, end-start)
		for i := range rows {
			at := min(start+i, end-1) // the padding repeats the last row
			for _, p := range vi.arrays {
				a = append(a, arrayAt(args[p], at))
			}
		}
		rt2.Queue(vi.sql(rows), a...)
	}
}

// arrayLen and arrayAt read the array arguments of a mode's writes.
func arrayLen(a any) int {
	switch a := a.(type) {
	case byteaArray:
		return len(a)
	case int8Array:
		return len(a)
	}
	panic(fmt.Sprintf("dedup: not an array argument: %T", a))
}

func arrayAt(a any, i int) any {
	switch a := a.(type) {
	case byteaArray:
		return nonNil(a[i])
	case int8Array:
		return a[i]
	}
	panic(fmt.Sprintf("dedup: not an array argument: %T", a))
}
